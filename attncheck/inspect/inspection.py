"""What `attncheck inspect` gives back of one head (attncheck.inspect's result): the walk, the model's side, or a flash
output's place, and the JSON each makes."""
from __future__ import annotations

from dataclasses import dataclass

from .flash import flash_dict
from .records import HeadWalk
from .render_model import model_walk_dict
from .walk_json import walk_dict


@dataclass(frozen=True)
class Inspection:
    """What `attncheck inspect` shows of one head: the walk (HeadWalk) and, with a model, the reference's side
    (model_walk.ModelWalk); on a flash-attention dump, the flash output's place (flash.FlashHead) and the model's."""

    walk: HeadWalk | None = None
    model: object | None = None  # model_walk.ModelWalk
    flash: object | None = None  # flash.FlashHead

    @property
    def passed(self) -> bool:
        return (self.walk is None or self.walk.passed) and (self.model is None or self.model.passed)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def to_dict(self) -> dict:
        """The JSON of `attncheck inspect --json` (schema 1)."""
        if self.flash is not None:
            return flash_dict(self.flash, self.model)
        doc = walk_dict(self.walk)
        if self.model is not None:
            doc["model"] = model_walk_dict(self.model)
        return doc
