"""Text from outside (documents, ids, metadata, a broker's or a server's message, a setting's value) as
a terminal shows it: secrets masked, control characters dropped, and Rich markup escaped, so that a
document holding ``[/x]`` or a terminal escape sequence is printed as the characters it holds, never
read as markup or as a command to the operator's terminal."""

from __future__ import annotations

import re

from rich.markup import escape

from schemas.redact import mask

#: C0 controls but tab and newline, DEL, and C1 controls (ESC, CSI and OSC among them).
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def shown(text: object) -> str:
    """``text`` masked, without control characters, with Rich markup escaped: safe inside a markup string."""
    return escape(_CONTROLS.sub("", mask(str(text))))
