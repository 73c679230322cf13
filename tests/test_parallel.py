"""Reading a dump in parts, in one process or several, gives the same report as reading it whole: the parts are cut
at evaluation starts (dump/parts.py) and their evaluations taken in dump order with the dump's own indices, runs
and n_past (dump/pool.py)."""
from __future__ import annotations

import io
import json

import pytest

import attncheck
from attncheck.dump import parts as parts_module
from attncheck.dump import pool as pool_module
from attncheck.dump import repeats
from conftest import FIXTURES, attncheck as run
from dumpedit import DumpEdit

DUMPS = sorted(p.name for p in FIXTURES.glob("*.txt")) + sorted(f"arch/{p.name}" for p in (FIXTURES / "arch").glob("*.txt"))


@pytest.fixture(autouse=True)
def workers_at_any_size(monkeypatch):
    """-j 2 reads a small file in one process (dump/pool.py's SERIAL); the tests here read small files in workers."""
    monkeypatch.setattr(pool_module, "SERIAL", 0)


def test_a_small_file_is_read_in_this_process(tmp_path, monkeypatch):
    """Below SERIAL bytes a file is read without workers whatever -j says (they do not pay for themselves there);
    at SERIAL and above, and from a stream of any size, -j 2 starts them."""
    path = tmp_path / "runs.txt"
    path.write_bytes((FIXTURES / "gpt2-long.txt").read_bytes() * 4)
    monkeypatch.setattr(parts_module, "PART", 3000)
    pools = []
    real = pool_module.worker_pool
    monkeypatch.setattr(pool_module, "worker_pool", lambda jobs: pools.append(jobs) or real(jobs))
    whole = report(path, jobs=1)
    monkeypatch.setattr(pool_module, "SERIAL", path.stat().st_size + 1)
    assert report(path, jobs=2) == whole and pools == []
    monkeypatch.setattr(pool_module, "SERIAL", path.stat().st_size)
    assert report(path, jobs=2) == whole and pools == [2]
    doc = attncheck.verify(io.BytesIO(path.read_bytes()), attncheck.Options(jobs=2)).to_dict()  # a stream
    assert pools == [2, 2] and doc["sites"] == whole["sites"]


def report(path, monkeypatch=None, part=None, jobs=1) -> dict:
    if part is not None:
        monkeypatch.setattr(parts_module, "PART", part)
    doc = attncheck.verify(str(path), attncheck.Options(jobs=jobs)).to_dict()
    doc.pop("source")
    return doc


@pytest.mark.parametrize("name", DUMPS)
def test_json_does_not_depend_on_jobs(name):
    one = run("check", FIXTURES / name, "-j", "1", "--json", "-")
    two = run("check", FIXTURES / name, "-j", "2", "--json", "-")
    assert one.code == two.code and one.out == two.out and one.err == two.err


@pytest.mark.parametrize("name", ["gpt2-ubatch2.txt", "llama-gqa-long.txt", "old-llama-gqa-how-are-you.txt",
                                  "arch/gemma2-ubatch2.txt", "arch/gpt-oss-long.txt"])
def test_many_small_parts_give_the_report_of_one(name, monkeypatch):
    whole = report(FIXTURES / name)
    cut = report(FIXTURES / name, monkeypatch, part=2000, jobs=2)  # a part per evaluation, or nearly
    assert cut == whole


def test_concatenated_runs_cut_anywhere(tmp_path, monkeypatch):
    """Three llama.cpp runs one after another (`cat a b c`): every cut keeps each evaluation in its run, n_past
    starting again with each run, the token ids of each run."""
    path = tmp_path / "three.txt"
    path.write_bytes(b"".join((FIXTURES / n).read_bytes() for n in ("gpt2-ubatch2.txt", "gpt2-long.txt",
                                                                    "gpt2-ubatch2.txt")))
    whole = report(path)
    assert whole["runs"] == 3 and [s["n_past"] for s in whole["sites"]][:6] == [0, 0, 2, 2, 4, 4]
    for part in (500, 3000, 60000, 120000):
        assert report(path, monkeypatch, part=part, jobs=2) == whole, part


def test_an_error_names_the_same_line(tmp_path, monkeypatch):
    """A garbled number in the third evaluation's weights (a node a check reads) of a dump cut into parts: the same
    one-line error, naming the same line, as read whole."""
    e = DumpEdit(FIXTURES / "gpt2-ubatch2.txt", tmp_path / "damaged.txt")
    e.set("kq_soft_max-0", (0, 0, 0), "0.0x00", occurrence=2)
    path = e.save()
    monkeypatch.setattr(parts_module, "PART", 3000)
    with pytest.raises(attncheck.DumpError) as cut:
        attncheck.verify(str(path), attncheck.Options(jobs=2))
    monkeypatch.setattr(parts_module, "PART", 1 << 30)
    with pytest.raises(attncheck.DumpError) as whole:
        attncheck.verify(str(path), attncheck.Options(jobs=1))
    assert str(cut.value) == str(whole.value)
    assert cut.value.line == e.line_of("kq_soft_max-0", (0, 0, 0), occurrence=2)


@pytest.mark.parametrize("size", [500, 3000, 60000])
def test_a_file_is_cut_where_a_stream_is(tmp_path, size):
    """A regular file is cut in a memory map into spans the workers read themselves; a stream is read in blocks:
    both give the same parts, with the same first lines."""
    import io

    path = tmp_path / "two.txt"
    path.write_bytes(b"".join((FIXTURES / n).read_bytes() for n in ("gpt2-ubatch2.txt", "llama-gqa-long.txt")))
    with open(path, "rb") as f:
        spans = list(parts_module.parts(f, size))
    mapped = [(p.text(), p.first_line, p.final) for p in spans]
    streamed = [(p.text(), p.first_line, p.final) for p in parts_module.parts(io.BytesIO(path.read_bytes()), size)]
    assert mapped == streamed and len(mapped) > 2
    assert all(p.data is None for p in spans)  # spans of the file, not copies of it
    assert b"".join(t for t, _, _ in mapped) == path.read_bytes()


def test_a_part_read_before_the_next_cut_hands_its_line_count_over(tmp_path):
    """Read in this process, a part's reader (dump/repeats.py's made) counts its newlines for the cut, which then
    does not count them again: the parts' first lines are the same either way, and the count was handed over."""
    path = tmp_path / "runs.txt"
    path.write_bytes((FIXTURES / "gpt2-long.txt").read_bytes() * 4)
    with open(path, "rb") as f:
        counted = [(p.text(), p.first_line, p.final) for p in parts_module.parts(f, 3000)]
    repeats._templates.clear()  # the parts are made from templates or read node by node, as they come
    with open(path, "rb") as f:
        read, handed = [], 0
        for p in parts_module.parts(f, 3000):
            pool_module.gather_part(p, str(path), None, lambda ev, source, layers: ev.index)
            handed += bool(p.newlines)
            read.append((p.text(), p.first_line, p.final))
    assert read == counted and len(read) > 3
    assert handed >= len(read) - 2  # all but the last (no next cut) and any part made() declines
    assert all(line == 1 + b"".join(t for t, _, _ in read[:i]).count(b"\n") for i, (_, line, _) in enumerate(read))


def test_stdin_is_read_in_parts_too():
    data = (FIXTURES / "gpt2-ubatch2.txt").read_bytes()
    r = run("check", "-", "-j", "2", "--json", "-", stdin=data)
    assert r.code == 0 and json.loads(r.out)["totals"]["sites"] == 6


def _checked_early(monkeypatch, early: int) -> dict[str, int]:
    """Set EARLY and count, per run that had early reports, whether they stood or the run was checked again."""
    from attncheck.check import dumponly

    monkeypatch.setattr(dumponly, "EARLY", early)
    seen = {"stood": 0, "redone": 0}
    check_pending = dumponly.DumpChecker._check_pending

    def spy(self, pinned):
        early = self._early
        out = check_pending(self, pinned)
        if early is not None and early.reports:
            seen["stood" if out[0] is early.reports[0] else "redone"] += 1
        return out

    monkeypatch.setattr(dumponly.DumpChecker, "_check_pending", spy)
    return seen


@pytest.mark.parametrize("name", DUMPS)
def test_sites_checked_early_give_the_report_of_a_whole_run(name, monkeypatch):
    """A run's sites are checked as they come under facts pinned on its first sites (check/dumponly.py's Early);
    the run's own pin decides in the end, so the report is the one checking the whole run at once gives."""
    from attncheck.check import dumponly

    monkeypatch.setattr(dumponly, "EARLY", 10**9)
    try:
        whole = report(FIXTURES / name)
    except attncheck.DumpError:
        pytest.skip("a damaged fixture: no report")
    seen = _checked_early(monkeypatch, 1)
    assert report(FIXTURES / name) == whole
    # each run with a site had its reports made early, then they stood or were made again
    assert sum(seen.values()) == (whole["runs"] if whole["totals"]["sites"] else 0)


def test_early_reports_fall_when_the_run_pins_other_factors(monkeypatch):
    """gemma2's soft-cap SCALE factors pinned on one site differ in their last digits from those pinned on all the
    run's sites: the early reports are dropped and the run checked again under its own pin."""
    from attncheck.check import dumponly

    monkeypatch.setattr(dumponly, "EARLY", 10**9)
    whole = report(FIXTURES / "arch/gemma2-ubatch2.txt")
    seen = _checked_early(monkeypatch, 1)
    assert report(FIXTURES / "arch/gemma2-ubatch2.txt") == whole
    assert seen == {"stood": 0, "redone": 1}


def test_list_does_not_depend_on_parts(tmp_path, monkeypatch):
    """`list` reads in parts too: three runs one after another, cut anywhere, list the same evaluations, runs,
    n_past and token ids as read whole."""
    from attncheck import list_dump

    path = tmp_path / "three.txt"
    path.write_bytes(b"".join((FIXTURES / n).read_bytes() for n in ("gpt2-ubatch2.txt", "llama-gqa-long.txt",
                                                                    "gpt2-ubatch2.txt")))
    monkeypatch.setattr(parts_module, "PART", 1 << 30)
    whole = list_dump(str(path), jobs=1)
    assert len(whole["runs"]) == 3 and whole["evaluations"] > 6
    for part in (500, 3000, 60000):
        monkeypatch.setattr(parts_module, "PART", part)
        assert list_dump(str(path), jobs=2) == whole, part
    one = run("list", path, "-j", "1", "--json", "-")
    two = run("list", path, "-j", "2", "--json", "-")
    assert one.code == two.code == 0 and one.out == two.out and one.err == two.err


@pytest.mark.parametrize("old,new", [("drift/phi3-cat.old.txt", "drift/phi3-cat.new.txt"),
                                     ("drift/old-llama-gqa-long.txt", "llama-gqa-long.txt"),
                                     ("gpt2-long.txt", "gpt2-long.txt")])
def test_diff_does_not_depend_on_jobs(old, new):
    """diff -j: the parent reads both dumps and decides what lines up; workers diff the pairs; the same report."""
    one = run("diff", FIXTURES / old, FIXTURES / new, "-j", "1", "--json", "-")
    two = run("diff", FIXTURES / old, FIXTURES / new, "-j", "2", "--json", "-")
    assert one.code == two.code and one.out == two.out and one.err == two.err
    assert json.loads(one.out)["totals"]["compared"] > 0


def test_diff_keeps_dump_order_around_unmatched_and_errors(tmp_path):
    """Evaluations one dump has and the other not, and a pair that does not line up, come in their place among the
    pairs diffed in workers: NEW with a second run OLD lacks, and OLD whose second run is another prompt."""
    a, b = (FIXTURES / "gpt2-ubatch2.txt").read_bytes(), (FIXTURES / "gpt2-long.txt").read_bytes()
    (tmp_path / "a.txt").write_bytes(a)
    (tmp_path / "aa.txt").write_bytes(a + a)
    (tmp_path / "ab.txt").write_bytes(a + b)
    for old, new in (("a.txt", "aa.txt"), ("aa.txt", "ab.txt")):
        one = run("diff", tmp_path / old, tmp_path / new, "-j", "1", "--json", "-")
        two = run("diff", tmp_path / old, tmp_path / new, "-j", "2", "--json", "-")
        assert one.code == two.code and one.out == two.out and one.err == two.err
        doc = json.loads(one.out)
        if new == "aa.txt":
            assert one.code == 0 and doc["totals"]["only_new"] > 0 and doc["nodes"]
        else:
            assert one.code == 2 and "different prompts" in doc["error"] and doc["nodes"]


def test_an_evaluation_crosses_to_a_worker_whole():
    """An evaluation pickled for a worker (diff -j) comes back with its nodes linked as read and its sites found."""
    import pickle

    from attncheck.dump.graph import read_dump

    ev = next(iter(read_dump(str(FIXTURES / "llama-gqa-long.txt")).evaluations()))
    back = pickle.loads(pickle.dumps(ev))
    assert [(n.name, n.line, n.body) for n in back.nodes] == [(n.name, n.line, n.body) for n in ev.nodes]
    assert [tuple(None if i is None else i.line for i in n.inputs) for n in back.nodes] == \
        [tuple(None if i is None else i.line for i in n.inputs) for n in ev.nodes]
    assert [s.info() for s in back.sites] == [s.info() for s in ev.sites] and back.sites
    assert (back.index, back.run, back.n_past, back.tokens, back.T) == (ev.index, ev.run, ev.n_past, ev.tokens, ev.T)


def _outputs(args: list[str], folder, monkeypatch) -> tuple[int, str, bytes]:
    """Exit code, stdout and stderr mixed, and the --html page (`page.html` in `folder`, so that the line naming it
    is the same) of the command line run in this process (so that dump/parts.py's PART, set small by the caller,
    cuts these small dumps into many parts)."""
    from click.testing import CliRunner

    from attncheck.cli import main

    folder.mkdir()
    monkeypatch.chdir(folder)
    page = folder / "page.html"
    done = CliRunner().invoke(main, [*args, "--html", "page.html"] if args[0] != "list" else args)
    assert done.exception is None or isinstance(done.exception, SystemExit), done.exception
    return done.exit_code, done.output, page.read_bytes() if page.exists() else b""


@pytest.mark.parametrize("part", [2000, 40000])
def test_every_command_prints_the_same_bytes_with_one_job_or_two(tmp_path, monkeypatch, part):
    """`check` (table, --json, --html page), `list` (table and --json) and `diff` (table, --json) with -j 1 and -j 2,
    the dumps cut into parts: byte for byte the same. Three runs one after another (gpt2's ubatches of 2, llama's
    GQA, gpt2's 13 tokens), a dump whose run is checked again under its own pin (gemma2) and a 2024 log."""
    three = tmp_path / "three.txt"
    three.write_bytes(b"".join((FIXTURES / n).read_bytes() for n in ("gpt2-ubatch2.txt", "llama-gqa-long.txt",
                                                                    "gpt2-long.txt")))
    monkeypatch.setattr(parts_module, "PART", part)
    with open(three, "rb") as f:
        assert len(list(parts_module.parts(f))) >= 3  # read in parts, several of them in workers with -j 2
    dumps = [three, FIXTURES / "arch/gemma2-ubatch2.txt", FIXTURES / "old-llama-gqa-how-are-you.txt"]
    commands = [[c, str(d), *more] for d in dumps for c, more in (("check", ()), ("check", ("--json", "-")),
                                                                  ("list", ()), ("list", ("--json", "-")))]
    commands += [["diff", str(FIXTURES / old), str(FIXTURES / new), *more]
                 for old, new in (("drift/old-llama-gqa-long.txt", "llama-gqa-long.txt"), ("gpt2-ubatch2.txt", str(three)))
                 for more in ((), ("--json", "-"))]
    for i, args in enumerate(commands):
        one = _outputs([*args, "-j", "1"], tmp_path / f"{i}-1", monkeypatch)
        two = _outputs([*args, "-j", "2"], tmp_path / f"{i}-2", monkeypatch)
        assert one == two, args
        assert one[1].strip() and (one[2] or args[0] == "list"), args  # something printed, a page written
