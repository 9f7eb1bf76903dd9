"""The system-prompt templates: the shipped ones (worker/core/templates/tools.j2, text.j2) or an
operator's (REACTQ_PROMPT_TEMPLATES_DIR holding tools.j2 and text.j2; REACTQ_PROMPT_TOOLS_TEMPLATE /
REACTQ_PROMPT_TEXT_TEMPLATE name one file each). Each is read and compiled once (re-read when the file
changes) and checked by rendering it with every variable: a template naming an unknown variable, or one
that does not compile, is refused when the settings load (a worker does not start with it). Jinja2 with
autoescape off (the output is a prompt, not HTML) and StrictUndefined (a missing variable is an error,
never an empty string)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import jinja2

from .core import prompts
from .core.models import Mode
from .errors import PromptTemplateError

SHIPPED_DIR = Path(__file__).parent / "core" / "templates"
FILE_NAMES = {Mode.TOOLS: "tools.j2", Mode.TEXT: "text.j2"}


def template_path(mode: Mode, directory: str | None = None, file: str | None = None) -> Path:
    """Where `mode`'s template comes from: its own file setting, else the directory's, else the shipped one."""
    if file:
        return Path(file)
    return Path(directory or SHIPPED_DIR) / FILE_NAMES[mode]


class _SampleTool:
    """A tool with one parameter, to check a template with (the runtime passes the real tools)."""

    name = "sample"
    description = "A sample tool."
    returns = "a sample"
    when = "to check the template"

    def openai_schema(self) -> dict[str, Any]:
        params = {"type": "object", "properties": {"query": {"type": "string", "description": "words"}},
                  "required": ["query"]}
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": params}}


@lru_cache(maxsize=16)
def _compiled(path: str, mtime_ns: int) -> jinja2.Template:
    try:
        source = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptTemplateError(f"cannot read prompt template {path}: {getattr(exc, 'strerror', exc)}") from None
    env = jinja2.Environment(autoescape=False, undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=False)
    try:
        template = env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise PromptTemplateError(f"prompt template {path}, line {exc.lineno}: {exc.message}") from None
    for mode in Mode:  # a template may be used for either mode's variables; check with and without tools
        for tools in ([], [_SampleTool()]):
            try:
                template.render(prompts.prompt_variables(mode, tools, prompts.PromptContext(
                    plan_instructions="x", run_instructions="y")))
            except jinja2.UndefinedError as exc:
                raise PromptTemplateError(f"prompt template {path}: {exc.message}; the variables are "
                                          f"{', '.join(sorted(_variables()))}") from None
            except Exception as exc:  # noqa: BLE001 - whatever an operator's template does wrong at render
                raise PromptTemplateError(f"prompt template {path} fails to render: "
                                          f"{type(exc).__name__}: {exc}") from None
    return template


def _variables() -> set[str]:
    return set(prompts.prompt_variables(Mode.TEXT, [], prompts.PromptContext()))


def load_template(path: Path) -> jinja2.Template:
    """The compiled, checked template at `path` (cached; re-read when the file changes)."""
    try:
        mtime = path.stat().st_mtime_ns
    except OSError as exc:
        raise PromptTemplateError(f"cannot read prompt template {path}: {exc.strerror}") from None
    return _compiled(str(path), mtime)


class TemplateSettings(Protocol):
    """The settings naming the templates (worker.config.Settings; it imports this module)."""

    prompt_templates_dir: str | None
    prompt_tools_template: str | None
    prompt_text_template: str | None


def system_template(settings: TemplateSettings, mode: Mode) -> jinja2.Template:
    """The template `mode`'s system prompt is rendered from under these settings."""
    file = settings.prompt_tools_template if mode == Mode.TOOLS else settings.prompt_text_template
    return load_template(template_path(mode, settings.prompt_templates_dir, file))
