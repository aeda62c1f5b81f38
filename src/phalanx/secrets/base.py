"""What a secret store is, whoever keeps it: this machine's file (``local.py``) or a team
server's table. A store holds named values with who set them and when; ``list`` never returns a
value. Names: letters, digits and ``_.-``, starting with a letter, a digit or ``_``; a team server
also knows ``PROJECT/NAME`` (a project's secret), which a local store refuses."""

from __future__ import annotations

import abc
from dataclasses import dataclass

from ..core.grammar import SECRET_NAME as NAME
from ..core.grammar import SECRET_SCOPED as SCOPED
from ..errors import SecretError
# Values are masked wherever the ranks print them: one this short would mask ordinary text.
SHORTEST_MASKED = 6


@dataclass(frozen=True)
class SecretInfo:
    """A secret as ``secret list`` shows it: never its value. Times are Unix seconds."""

    name: str
    owner: str
    created: float
    updated: float
    where: str  # "file" or "keyring" (the local store), "server" (a team server's table)

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "owner": self.owner, "created": self.created, "updated": self.updated,
                "where": self.where}


def check_name(name: str) -> str:
    """``name`` if it can name a secret (a team server's ``PROJECT/NAME`` too); else SecretError."""
    if NAME.match(name) or SCOPED.match(name):
        return name
    raise SecretError(f"'{name}' is not a secret name",
                      "use letters, digits and _.- (starting with a letter, digit or _), e.g. HF_TOKEN")


def check_value(value: str) -> str:
    """A value a process environment can hold: not empty, no NUL character."""
    if not value:
        raise SecretError("the secret's value is empty", "give the value on standard input or at the prompt")
    if "\x00" in value:
        raise SecretError("the secret's value holds a NUL character, which no environment variable can",
                          "give the value without it (binary data: base64 it)")
    return value


class SecretStore(abc.ABC):
    """Named values, their owners and dates. ``where`` says in words where they live (messages).

    Every method blocks briefly (a file, a keyring, a server round trip) and raises
    ``SecretError`` (exit 2) for what the user can fix: an unknown name, a store that may not be
    read (its file open to others), a name this store cannot hold."""

    where: str = ""

    @abc.abstractmethod
    def set(self, name: str, value: str, owner: str) -> bool:
        """Store ``value`` under ``name`` (replacing one there); True when it was new."""

    @abc.abstractmethod
    def get(self, name: str) -> str:
        """The value of ``name``; SecretError when there is none or it may not be read."""

    @abc.abstractmethod
    def list(self) -> list[SecretInfo]:
        """Every secret of this store, by name; never a value."""

    @abc.abstractmethod
    def remove(self, name: str) -> bool:
        """Forget ``name``; False when there was none."""

    def missing(self, name: str) -> SecretError:
        return SecretError(f"no secret '{name}' in {self.where}",
                           f"set it with: phalanx secret set {name} (the value on stdin or at the prompt); "
                           "see: phalanx secret list")
