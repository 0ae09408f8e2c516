"""The errors every layer may raise and the exit codes the CLI maps them to.

The bottom of the package: it imports nothing of hpolab, so any module can raise these without
pulling in the CLI (which imports everything).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # the work failed (a study that cannot go on, an unreachable store)
EXIT_BAD_INPUT = 2  # spec, arguments, missing study: the message names the fix
EXIT_REFUSED = 3  # promotion refused: the challenger is not better than the alias holder
EXIT_INTERRUPTED = 130  # Ctrl-C: the stores are consistent; re-run to continue
EXIT_TERMINATED = 143  # SIGTERM (128 + 15): like Ctrl-C; re-run to continue


class UserError(Exception):
    """A problem the user can fix; printed as one clear message, no traceback (exit 2)."""


class StudyError(Exception):
    """The study cannot go on (e.g. its LR range test failed); one message, exit code 1."""


class StoreUnreachable(StudyError):
    """A store's URL is well formed but its server does not answer (exit 1): one line, the URL redacted."""


class SpecError(Exception):
    """A spec that cannot be used. `problems` are 'path: message' lines, all of them (exit 2)."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(problems))

    def render(self) -> str:
        lines = [f"invalid study spec {self.source} ({len(self.problems)} problem{'s' * (len(self.problems) > 1)}):"]
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)
