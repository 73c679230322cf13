"""A llama-eval-callback with one patch applied to llama.cpp, rebuilt from the cmake build that
scripts/build_llama.sh keeps, recompiling only the objects the patch touches.

    python3 scripts/llama_rebuild.py PATCH [PATCH ...]     # prints each binary's path
    python3 scripts/llama_rebuild.py --clean PATCH ...     # the control: the same objects, unpatched

The build folder $ATTNCHECK_LLAMA_DIR/build (default ~/.cache/attncheck/llama-0.3.36/build) holds every object and
archive of the build, `compile_commands.json`, the dependencies gcc wrote for each object (`X.o.d`) and each
target's link command (`CMakeFiles/T.dir/link.txt`). For a patch this
1. copies the sources once into $ATTNCHECK_LLAMA_DIR/mutants/src (the build's own sources are never written),
   sets the files the patch names back to the build's sources, applies the patch there (`patch -p1`);
2. recompiles, with the build's own command, every object whose dependencies name a patched file (a generated
   unity file, which #includes the model sources by absolute path, is copied with those paths pointed at the copy);
3. re-archives each library with a recompiled member by its target's own `ar` command, the other members taken
   from the build, and links llama-eval-callback by its own link command with those archives;
4. sets the patched files back, so the copy stays the build's sources between patches.
The binary is $ATTNCHECK_LLAMA_DIR/mutants/bin/KEY/llama-eval-callback, KEY a hash of the patch and of the build's
binary: a patch built once is not built again. A file lock keeps two runs from patching the copy at once.
$ATTNCHECK_MUTANTS_DIR puts the mutants' folder (copy, objects, binaries, and llama_mutants.py's models and dumps)
elsewhere.

The control (`clean=True`) recompiles the same objects from the unpatched copy and links them the same way, so a
difference between the control and a mutant is the patch's alone.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from fetch_models import sha256 as sha256_file

LLAMA_DIR = Path(os.environ.get("ATTNCHECK_LLAMA_DIR") or Path.home() / ".cache" / "attncheck" / "llama-0.3.36")
TARGET = "llama-eval-callback"
JOBS = int(os.environ.get("ATTNCHECK_BUILD_JOBS") or 2)  # compilers at once, as scripts/build_llama.sh
KEY_VERSION = b"attncheck llama_rebuild 1\n"


class RebuildError(RuntimeError):
    """A patch that does not apply, an object that does not compile, a build folder that is not as expected."""


def log(msg: str) -> None:
    print(f"[llama_rebuild] {msg}", file=sys.stderr, flush=True)


def patched_files(patch: bytes) -> list[str]:
    """The source paths (relative to the llama.cpp root) a unified diff changes: its `+++ b/PATH` lines."""
    out = []
    for line in patch.decode().splitlines():
        m = re.match(r"^\+\+\+ b/(\S+)", line)
        if m and m.group(1) not in out:
            out.append(m.group(1))
    if not out:
        raise RebuildError("no '+++ b/PATH' line: not a unified diff with a/ b/ prefixes")
    return out


@dataclass
class Build:
    """The cmake build folder of scripts/build_llama.sh and the mutants' folder beside it."""
    root: Path = LLAMA_DIR
    src: Path = field(init=False)
    build: Path = field(init=False)
    work: Path = field(init=False)

    def __post_init__(self) -> None:
        self.src, self.build = self.root / "src", self.root / "build"
        self.work = Path(os.environ.get("ATTNCHECK_MUTANTS_DIR") or self.root / "mutants")

    # --- what the build folder says -----------------------------------------------------------------------
    def base_binary(self) -> Path:
        return self.root / "bin" / TARGET

    def check(self) -> None:
        """RebuildError naming what is missing, when the build folder is not one scripts/build_llama.sh made."""
        for p in (self.base_binary(), self.build / "compile_commands.json", self.link_txt(TARGET), self.src):
            if not p.exists():
                raise RebuildError(f"{p} is missing: run scripts/build_llama.sh (make llama) first")

    def link_txt(self, target: str) -> Path:
        found = list(self.build.glob(f"**/CMakeFiles/{target}.dir/link.txt"))
        if len(found) != 1:
            raise RebuildError(f"found {len(found)} link commands for target {target} under {self.build}")
        return found[0]

    def compile_entries(self) -> list[dict]:
        """compile_commands.json's entries, each with the absolute path of its object ('object')."""
        entries = json.loads((self.build / "compile_commands.json").read_text())
        for e in entries:
            out = e.get("output") or shlex.split(e["command"])[shlex.split(e["command"]).index("-o") + 1]
            e["object"] = os.path.normpath(os.path.join(e["directory"], out))
        return entries

    @staticmethod
    def dependencies(obj: str) -> set[str]:
        """The files gcc recorded the object as built from (its `.o.d`), as normalized absolute paths."""
        d = Path(obj + ".d")
        if not d.exists():
            return set()
        text = d.read_text().replace("\\\n", " ")
        deps = text.split(":", 1)[1].split() if ":" in text else []
        return {os.path.normpath(p) for p in deps}

    def target_objects(self) -> dict[str, Path]:
        """Every object llama-eval-callback is linked from (directly or through an archive it links), by path,
        mapped to the link.txt that puts it there."""
        out: dict[str, Path] = {}
        exe_link = self.link_txt(TARGET)
        for cwd, argv in self.link_lines(exe_link):
            for arg in argv:
                path = os.path.normpath(os.path.join(cwd, arg))
                if arg.endswith(".o"):
                    out[path] = exe_link
                elif arg.endswith(".a") and path.startswith(str(self.build)):
                    lib_link = self.archive_link(Path(path))
                    for lcwd, largv in self.link_lines(lib_link):
                        for a in largv:
                            if a.endswith(".o"):
                                out[os.path.normpath(os.path.join(lcwd, a))] = lib_link
        return out

    def link_lines(self, link_txt: Path) -> list[tuple[str, list[str]]]:
        """Each command of a link.txt with the folder it runs in (the target's folder: link.txt's grandparent's
        parent, where cmake runs it)."""
        cwd = str(link_txt.parent.parent.parent)
        return [(cwd, shlex.split(line)) for line in link_txt.read_text().splitlines() if line.strip()]

    def archive_link(self, archive: Path) -> Path:
        """The link.txt whose `ar` command writes the archive."""
        stem = archive.name[3:-2] if archive.name.startswith("lib") else archive.stem
        cand = archive.parent / "CMakeFiles" / f"{stem}.dir" / "link.txt"
        if not cand.exists():
            raise RebuildError(f"no link command for {archive} (looked for {cand})")
        return cand

    # --- the copy -------------------------------------------------------------------------------------------
    def copy_sources(self) -> Path:
        """The copy of the sources, made once."""
        copy = self.work / "src"
        done = self.work / "src.complete"
        if not done.exists():
            log(f"copying the sources into {copy}")
            if copy.exists():
                shutil.rmtree(copy)
            shutil.copytree(self.src, copy, symlinks=True)
            done.write_text(str(self.src) + "\n")
        return copy

    def restore(self, copy: Path, rel: list[str]) -> None:
        """Set the named files of the copy back to the build's sources."""
        for r in rel:
            orig, dst = self.src / r, copy / r
            if orig.exists():
                shutil.copy2(orig, dst)
            elif dst.exists():
                dst.unlink()

    # --- a rebuild ------------------------------------------------------------------------------------------
    def key(self, patch: bytes, clean: bool) -> str:
        h = hashlib.sha256(KEY_VERSION)
        h.update(sha256_file(self.base_binary()).encode())
        h.update(b"clean\n" if clean else b"mutant\n")
        h.update(patch)
        return h.hexdigest()[:16]

    def binary(self, patch: bytes, clean: bool = False, also: list[bytes] = ()) -> Path:
        """The llama-eval-callback with the patch (clean: without it, the same objects recompiled; `also`: more
        patches whose objects the control recompiles too), built once and cached by KEY."""
        self.check()
        touched = patched_files(patch) + [f for p in also for f in patched_files(p)]
        key = self.key(patch + b"".join(also), clean)
        out = self.work / "bin" / key / TARGET
        if out.exists():
            return out
        t0 = time.time()
        self.work.mkdir(parents=True, exist_ok=True)
        with open(self.work / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if out.exists():
                return out
            copy = self.copy_sources()
            self.restore(copy, touched)
            try:
                if not clean:
                    self.apply(copy, patch)
                objdir = self.work / "obj" / key
                if objdir.exists():
                    shutil.rmtree(objdir)
                objdir.mkdir(parents=True)
                rebuilt = self.recompile(copy, touched, objdir)
            finally:
                self.restore(copy, touched)
            self.link(rebuilt, objdir, out)
        log(f"{'control' if clean else 'mutant'} {key}: {len(rebuilt)} objects recompiled, linked in "
            f"{time.time() - t0:.0f} s: {out}")
        return out

    def apply(self, copy: Path, patch: bytes) -> None:
        done = subprocess.run(["patch", "-p1", "--batch", "--forward", "--no-backup-if-mismatch", "-d", str(copy)],
                              input=patch, capture_output=True)
        if done.returncode != 0:
            raise RebuildError("the patch does not apply: " + (done.stdout + done.stderr).decode()[-600:])

    def recompile(self, copy: Path, touched: list[str], objdir: Path) -> dict[str, Path]:
        """{object of the build: its recompiled copy} for every object of the target that depends on a touched
        file, each compiled by the build's own command with the sources read from the copy."""
        touched_abs = {os.path.normpath(str(self.src / r)) for r in touched}
        linked = self.target_objects()
        rebuilt: dict[str, Path] = {}
        jobs: list[tuple[str, list[str], str]] = []
        for e in self.compile_entries():
            obj = e["object"]
            if obj not in linked:
                continue
            deps = self.dependencies(obj) | {os.path.normpath(e["file"])}
            if not deps & touched_abs:
                continue
            mine = objdir / Path(obj).relative_to(self.build)
            mine.parent.mkdir(parents=True, exist_ok=True)
            argv = shlex.split(e["command"])
            argv[argv.index("-o") + 1] = str(mine)
            argv = [self.to_copy(a, copy) for a in argv]
            source = os.path.normpath(e["file"])
            if source.startswith(str(self.build)):  # a generated unity file: #includes the sources by path
                text = Path(source).read_text().replace(str(self.src) + "/", str(copy) + "/")
                gen = mine.with_name(Path(source).name)
                gen.write_text(text)
                argv = [str(gen) if os.path.normpath(os.path.join(e["directory"], a)) == source else a
                        for a in argv]
            jobs.append((obj, argv, e["directory"]))
            rebuilt[obj] = mine
        if not rebuilt:
            raise RebuildError(f"no object of {TARGET} depends on {', '.join(touched)}")

        def compile_one(job: tuple[str, list[str], str]) -> None:
            obj, argv, cwd = job
            log(f"compiling {Path(obj).relative_to(self.build)}")
            done = subprocess.run(["nice", "-n", "10", *argv], cwd=cwd, capture_output=True, text=True)
            if done.returncode != 0:
                raise RebuildError(f"compiling {obj} failed:\n{done.stderr[-2000:]}")

        with ThreadPoolExecutor(JOBS) as pool:
            list(pool.map(compile_one, jobs))
        return rebuilt

    def to_copy(self, arg: str, copy: Path) -> str:
        """A compiler argument with the build's source folder replaced by the copy (-I paths, the source)."""
        src = str(self.src)
        return arg.replace(src + "/", str(copy) + "/") if src + "/" in arg else (str(copy) if arg == src else arg)

    def link(self, rebuilt: dict[str, Path], objdir: Path, out: Path) -> None:
        """Archives with the recompiled members (each by its target's own ar and ranlib commands), then the
        executable by its own link command, written to `out`."""
        linked = self.target_objects()
        archives: dict[str, str] = {}
        for link_txt in sorted({linked[o] for o in rebuilt} - {self.link_txt(TARGET)}):
            lines = self.link_lines(link_txt)
            cwd = lines[0][0]
            name = next(a for a in lines[0][1] if a.endswith(".a"))
            target = os.path.normpath(os.path.join(cwd, name))
            mine = objdir / Path(target).relative_to(self.build)
            mine.parent.mkdir(parents=True, exist_ok=True)
            if mine.exists():
                mine.unlink()
            for lcwd, argv in lines:
                argv = [self.substitute(a, lcwd, rebuilt, {target: str(mine)}) for a in argv]
                self.run(argv, lcwd)
            archives[target] = str(mine)
        (cwd, argv), = self.link_lines(self.link_txt(TARGET))
        argv = [self.substitute(a, cwd, rebuilt, archives) for a in argv]
        tmp = out.with_name(out.name + ".tmp")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        argv[argv.index("-o") + 1] = str(tmp)
        log(f"linking {TARGET}")
        self.run(["nice", "-n", "10", *argv], cwd)
        tmp.rename(out)

    @staticmethod
    def substitute(arg: str, cwd: str, objects: dict[str, Path], archives: dict[str, str]) -> str:
        path = os.path.normpath(os.path.join(cwd, arg))
        if path in objects:
            return str(objects[path])
        return archives.get(path, arg)

    @staticmethod
    def run(argv: list[str], cwd: str) -> None:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RebuildError(f"{argv[0]} failed in {cwd}:\n{done.stderr[-2000:]}")


def main(argv: list[str]) -> int:
    clean = "--clean" in argv
    paths = [Path(a) for a in argv if a != "--clean"]
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    build = Build()
    try:
        patches = [p.read_bytes() for p in paths]
        if clean:
            print(build.binary(patches[0], clean=True, also=patches[1:]))
        else:
            for p in patches:
                print(build.binary(p))
    except (RebuildError, OSError) as e:
        print(f"llama_rebuild: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
