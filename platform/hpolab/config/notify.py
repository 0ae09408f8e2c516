"""The spec's `notify:` section: where a study's events are sent.

    notify:
      - url: https://hooks.example.com/hpolab      # POST, JSON body, signed when secret_env is given
        events: [study_finished, new_best, trial_failed]
        secret_env: HOOK_SECRET                      # the HMAC-SHA256 key, read from the environment
      - url: ${SLACK_WEBHOOK_URL}                    # ${VAR}: read from the environment when sending
        format: slack
      - command: [notify-send-json, --channel, ml]   # a program; the event's JSON on its stdin

Secrets never sit in the spec: a `${VAR}` in `url` or `command` and `secret_env` are read from the
environment of the process that sends (the driver, or `promote` / `study set`), and nothing that
prints or records the spec expands them. The delivery itself lives in study/driver/notify*.py.
"""

from __future__ import annotations

import re
from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# The events, in the order a study meets them; each payload's `event` field holds one of these names.
EVENTS = ("study_started", "study_finished", "study_error", "trial_failed", "new_best", "worker_lost",
          "champion_changed", "control_changed")
EventName = Literal["study_started", "study_finished", "study_error", "trial_failed", "new_best", "worker_lost",
                    "champion_changed", "control_changed"]
ENV_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class NotifyTarget(BaseModel):
    """One receiver: a web hook (`url`) or a program (`command`), and the events it gets."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str | None = Field(default=None, description="http(s) address POSTed to; ${VAR} parts are read from the environment")
    command: Union[str, list[str], None] = Field(default=None, description="a program run with the event's JSON on stdin (instead of url)")
    events: list[EventName] = Field(default_factory=lambda: list(EVENTS), description="the events sent (default: all)")
    format: Literal["json", "slack"] = Field(default="json", description="json: the event as JSON, signed; slack: a Slack-compatible {text: ...}")
    secret_env: str | None = Field(default=None, description="environment variable holding the HMAC-SHA256 key of X-Hpolab-Signature")
    timeout: float = Field(default=10.0, gt=0, description="seconds one delivery attempt may take")
    retries: int = Field(default=3, ge=0, description="attempts after the first, with backoff (1 s, 2 s, 4 s, ...)")

    @field_validator("secret_env")
    @classmethod
    def _env_name(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            raise ValueError(f"{v!r}: give the name of an environment variable (e.g. HOOK_SECRET), not its value")
        return v

    @field_validator("events")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError(f"give at least one of {', '.join(EVENTS)} (or leave events out: all of them)")
        return list(dict.fromkeys(v))

    @model_validator(mode="after")
    def _one_kind(self) -> "NotifyTarget":
        if (self.url is None) == (self.command is None):
            raise ValueError("give either url: (a web hook) or command: (a program), not both")
        if self.url is not None and not ENV_VAR.fullmatch(self.url.strip()) and not re.match(r"^https?://[^/\s]+", self.url):
            raise ValueError(f"url: {self.url!r} is not an http(s) address (or a ${{VAR}} holding one)")
        login = re.match(r"^https?://([^/]*)@", self.url or "")
        if login and ENV_VAR.sub("", login[1]).replace(":", ""):  # (the spec is recorded with the study: no secret in it)
            raise ValueError("url: a login in the url would be recorded with the spec; read it from the environment, "
                             "e.g. https://${HOOK_USER}:${HOOK_PASSWORD}@host/path")
        if self.command is not None and self.format == "slack":
            raise ValueError("format: slack needs a url: (a Slack-compatible incoming webhook)")
        if self.command is not None and self.secret_env is not None:
            raise ValueError("secret_env signs web requests; a command: gets the environment itself")
        if self.command is not None and not (self.command if isinstance(self.command, list) else self.command.strip()):
            raise ValueError("command: give the program to run")
        return self

    def variables(self) -> list[str]:
        """The environment variables this target reads when it sends."""
        parts = [self.url or ""] + (self.command if isinstance(self.command, list) else [self.command or ""])
        names = [m for p in parts for m in ENV_VAR.findall(p)]
        return names + ([self.secret_env] if self.secret_env else [])

    def describe(self, index: int) -> str:
        """How messages name this target: never a secret (only the host of a url, or the program's name)."""
        if self.url is not None:
            m = re.match(r"^(https?)://(?:[^@/]*@)?([^/:?#]+)", self.url.strip())
            where = f"{m[1]}://{m[2]}/..." if m else "a url from the environment"
        else:
            first = self.command[0] if isinstance(self.command, list) else self.command.split()[0]
            where = f"command {first.rsplit('/', 1)[-1]}"
        return f"notify[{index}] ({where})"
