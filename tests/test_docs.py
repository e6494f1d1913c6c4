"""README.md and docs/*.md against the code: each ``d2l-transformer`` command parses with the
package's own parser, each ``scripts/NAME.py`` exists and takes the options written after it,
each file of the repository named exists, each relative link and ``#anchor`` resolves, each
``--set FIELD=VALUE`` names a config field. Nothing runs: a command is only parsed, a link only
looked up."""

import argparse
import dataclasses
import re
import runpy
import shlex
from pathlib import Path

import pytest

from d2l_transformer.cli.commands import get_parser
from d2l_transformer.config import TransformerConfig

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROGRAM = re.compile(r"(?<![\w./-])(?:[\w./-]*/)?d2l-transformer(?=\s|$)")  # not `[extras]`
SCRIPT = re.compile(r"\bscripts/(\w+)\.py\b")
# where a command ends: a pipe, &&, ;, a redirection, a shell comment
END = re.compile(r"\s(?:\|\|?|&&|\d?>>?|<)\s|;(?:\s|$)|(?:^|\s)#")
FLAG = re.compile(r"(?<![\w-])--?[A-Za-z][\w-]*")
SET = re.compile(r"--set[ =]([^\s`]+)")
PATH = re.compile(r"(?<![\w/.-])((?:d2l_transformer|scripts|tests|oracles|notebooks|docs)/"
                  r"[\w/.*-]*\w\*?)")
PATH_PLACEHOLDERS = {"tests/test_X.py"}  # install.md: any test file
SET_PLACEHOLDERS = {"FIELD=VALUE", "field=value"}  # the option's own synopsis (usage.md)


def _code(path):
    """``(line, text)`` of each piece of code in `path`: a fenced block's lines (a line ending
    in a backslash joined with the next) and each inline `span` (one may wrap a line)."""
    fence, joined, paragraph = None, None, []
    lines = path.read_text(encoding="utf-8").splitlines() + [""]
    for n, line in enumerate(lines, 1):
        mark = re.match(r"\s*(```|~~~)", line)
        if fence:
            if mark and mark.group(1) == fence:
                fence = None
                continue
            start, text = joined or (n, "")
            text += line.rstrip()
            joined = (start, text[:-1] + " ") if text.endswith("\\") else None
            if joined is None:
                yield start, text
        elif mark or not line.strip():
            fence = mark.group(1) if mark else None
            text = "\n".join(p for _, p in paragraph)
            for m in re.finditer(r"`([^`]+)`", text):
                span = m.group(1).replace("\\|", "|").replace("\n", " ")
                yield paragraph[0][0] + text.count("\n", 0, m.start()), span
            paragraph = []
        else:
            paragraph.append((n, line))


def _items(what):
    """What `what` yields over every doc, as test parameters named ``doc:line``."""
    return [pytest.param(text, id=f"{path.relative_to(ROOT)}:{n}")
            for path in DOCS for n, text in what(path)]


def _commands(path):
    """``d2l-transformer ...`` command lines: ``(line, argv)``, the program's name dropped."""
    for n, text in _code(path):
        for m in PROGRAM.finditer(text):
            argv = shlex.split(END.split(text[m.end():])[0])
            if argv:  # the bare name names the program, it is no command line
                yield n, argv


def _subparsers(parser):
    return next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def _synopsis(argv):
    """Whether `argv` is a synopsis (``[--beam K]``, ``mxnet|ctranslate2``, ``...``) or a bare
    command's name (``serve``, required options left out): its options are checked, not parsed,
    as its placeholders (``K``) need not be values."""
    return len(argv) == 1 or any(re.search(r"[][|]|\.\.\.", arg) for arg in argv)


@pytest.mark.parametrize("argv", _items(_commands))
def test_command_parses(argv):
    """Each option is one of its command's, spelled out (argparse would take ``--mod`` for
    ``--model``), each of a synopsis's ``a|b`` one of its choices; a command line parses."""
    parser = get_parser()
    words = [a.strip("[]") for a in argv[:argv.index("--") if "--" in argv else None]]
    for command in words[0].split("|"):
        sub = _subparsers(parser).get(command)
        assert sub, f"no command {command!r}"
        options = sub._option_string_actions
        for word, value in zip(words[1:], words[2:] + [""]):
            for flag in FLAG.findall(word) if word.startswith("-") else ():
                assert flag in options, f"{command} has no option {flag}"
                choices = options[flag].choices
                if "|" in value and choices:
                    assert set(value.split("|")) <= set(choices), f"{flag} {value}: {choices}"
    if not _synopsis(argv):
        try:
            parser.parse_args(argv)
        except SystemExit as e:
            assert e.code == 0, f"d2l-transformer {shlex.join(argv)}: does not parse"


class _Parsed(Exception):
    """Raised in place of parsing: carries the parser a script's ``main`` built."""


_OPTIONS = {}  # script: its parser's options, each script imported once


def _script_options(name, monkeypatch):
    """``{option string: action}`` of scripts/NAME.py's parser: its ``get_parser()``'s, or the
    one its ``main(argv)`` builds (caught at ``parse_args``, before anything runs)."""
    if name not in _OPTIONS:
        _OPTIONS[name] = _load_options(name, monkeypatch)
    return _OPTIONS[name]


def _load_options(name, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))  # they import one another by name
    script = runpy.run_path(str(ROOT / "scripts" / f"{name}.py"), run_name=f"docs_{name}")
    if "get_parser" in script:
        return script["get_parser"]()._option_string_actions

    def caught(parser, *args, **kwargs):
        raise _Parsed(parser)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", caught)
    assert "main" in script, f"scripts/{name}.py is no command (no main)"
    with pytest.raises(_Parsed) as parsed:
        script["main"]([])
    return parsed.value.args[0]._option_string_actions


def _script_words(path):
    """``(line, (script, [the words after it]))`` of each script a piece of code names."""
    for n, text in _code(path):
        for m in SCRIPT.finditer(text):
            yield n, (m.group(1), [w.strip("[]") for w in shlex.split(END.split(text[m.end():])[0])])


def _placeholder(value):
    """A value a synopsis names (``GROUP``, ``DIR``, ``...``), not one to check."""
    return value.isupper() or "..." in value


@pytest.mark.parametrize("script", _items(_script_words))
def test_script_options(script, monkeypatch):
    """Each option written after a script is one of its parser's, spelled out; a value given
    to an option with choices is one of them."""
    name, words = script
    assert (ROOT / "scripts" / f"{name}.py").is_file(), f"no scripts/{name}.py"
    for word, value in zip(words, words[1:] + [""]):
        for flag in FLAG.findall(word) if word.startswith("-") else ():
            options = _script_options(name, monkeypatch)
            assert flag in options, f"scripts/{name}.py has no option {flag}"
            choices = options[flag].choices
            if choices and value and not value.startswith("-") and not _placeholder(value):
                assert set(value.split("|")) <= set(choices), f"{flag} {value}: {choices}"


def test_paths_exist():
    """Every file of the repository the docs name, in code or prose (a glob matches one)."""
    missing = {f"{path.name}: {name}" for path in DOCS
               for name in PATH.findall(path.read_text(encoding="utf-8"))
               if name not in PATH_PLACEHOLDERS and not list(ROOT.glob(name))}
    assert not missing


def slug(heading):
    """GitHub's anchor of a heading: its text (links as their text, no backticks), lower-case,
    every character but letters, digits, spaces, '-' and '_' removed, spaces as '-'."""
    text = re.sub(r"\[([^]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path):
    """The anchors of `path`'s headings (outside fenced code), a repeated one as GitHub numbers
    it (``name``, ``name-1``, ...)."""
    seen, fence = {}, False
    for line in path.read_text(encoding="utf-8").splitlines():
        fence ^= bool(re.match(r"\s*(```|~~~)", line))
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading and not fence:
            name = slug(heading.group(1))
            yield name if name not in seen else f"{name}-{seen[name]}"
            seen[name] = seen.get(name, 0) + 1


def _links(path):
    """``(line, link)`` of each relative Markdown link or image outside code."""
    text, fence = path.read_text(encoding="utf-8"), False
    for n, line in enumerate(text.splitlines(), 1):
        fence ^= bool(re.match(r"\s*(```|~~~)", line))
        for m in re.finditer(r"\]\(([^)\s]+)\)", re.sub(r"`[^`]*`", "", line)):
            if not fence and not re.match(r"[a-z]+:", m.group(1)):
                yield n, (path, m.group(1))


@pytest.mark.parametrize("link", _items(_links))
def test_link_resolves(link):
    path, target = link
    file, _, anchor = target.partition("#")
    file = (path.parent / file).resolve() if file else path
    assert file.exists(), f"{target}: no {file}"
    if anchor:
        assert anchor in set(anchors(file)), f"{target}: no heading #{anchor} in {file.name}"


def _sets(path):
    for n, text in _code(path):
        for item in SET.findall(text):
            if item not in SET_PLACEHOLDERS:
                yield n, item


@pytest.mark.parametrize("item", _items(_sets))
def test_set_names_a_field(item):
    field = item.partition("=")[0]
    assert field in {f.name for f in dataclasses.fields(TransformerConfig)}, f"no field {field}"


def test_commands_are_fenced():
    """A command in an indented code block would escape these checks: code is fenced."""
    for path in DOCS:
        fence = False
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            fence ^= bool(re.match(r"\s*(```|~~~)", line))
            assert fence or not re.match(r" {4,}(\S*/)?(d2l-transformer|python|scripts/)", line), \
                f"{path.name}:{n}: an indented code block, not a fenced one"


@pytest.mark.parametrize("doc", ["README.md", "docs/data.md"])
def test_the_bible_commands_are_the_runs_that_gave_its_figure(doc):
    """The Bible's 21.91: its train command (12 epochs, the average of the last 4) and the
    `evaluate ... --beam 4` of that average, as each doc writes them, parsed."""
    commands = [argv for _, argv in _commands(ROOT / doc)]
    parser = get_parser()
    train = [parser.parse_args(a) for a in commands  # the recipe: its epochs averaged
             if a[0] == "train" and any("bible/train.en" in w for w in a) and "--average-last" in a]
    assert len(train) == 1, commands
    run = train[0]
    assert (run.preset, run.epochs, run.average_last) == ("hour", 12, 4)
    assert run.valid and run.test and run.data
    evaluate = [parser.parse_args(a) for a in commands
                if a[0] == "evaluate" and any(run.out in w for w in a)]
    assert [(e.model, e.beam) for e in evaluate] == [(f"{run.out}/average", 4)]
