"""The package as `pip install '.[cpu]'` (not editable) gives it: every subpackage in the
wheel, nothing hidden from git by .gitignore, and the console script trains from a fresh venv
outside the source tree."""

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "d2l_transformer")
SOURCE_SUFFIXES = (".py", ".cc", ".h", ".html")  # the modules and their package data


def _git(*args):
    return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True, timeout=60)


def _in_git_checkout():
    return shutil.which("git") is not None and _git("rev-parse", "--git-dir").returncode == 0


def _source_files():
    """The package's files on disk, relative to the root (no caches)."""
    found = []
    for d, dirs, names in os.walk(PACKAGE):
        dirs[:] = [n for n in dirs if n != "__pycache__"]
        found += [os.path.relpath(os.path.join(d, n), ROOT).replace(os.sep, "/")
                  for n in names if n.endswith(SOURCE_SUFFIXES)]
    return sorted(found)


def test_no_package_file_is_hidden_from_git():
    """A pattern of .gitignore (``dist/`` once hid ``d2l_transformer/dist/``) must match no file
    of the package: such a file is never committed, and a clean checkout lacks it."""
    if not _in_git_checkout():
        pytest.skip("not a git checkout")
    ignored = _git("ls-files", "--others", "--ignored", "--exclude-standard", "--",
                   "d2l_transformer").stdout.split()
    assert [f for f in ignored if f.endswith(SOURCE_SUFFIXES)] == []
    tracked = set(_git("ls-files", "--", "d2l_transformer").stdout.split())
    untracked = set(_git("ls-files", "--others", "--exclude-standard", "--",
                         "d2l_transformer").stdout.split())
    assert set(_source_files()) <= tracked | untracked  # committed, or committable as they are


def _checkout(dst):
    """The files a clean checkout has (tracked, or not ignored) that building needs: the top
    level and the package."""
    if _in_git_checkout():
        files = _git("ls-files", "--cached", "--others", "--exclude-standard").stdout.split()
    else:
        files = [f for f in os.listdir(ROOT) if os.path.isfile(os.path.join(ROOT, f))]
        files += _source_files()
    for rel in files:
        if ("/" not in rel or rel.startswith("d2l_transformer/")) and \
                os.path.isfile(os.path.join(ROOT, rel)):
            os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, rel), os.path.join(dst, rel))


def _run(cmd, **kwargs):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, **kwargs)
    assert r.returncode == 0, f"{cmd}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.mark.slow
def test_wheel_installs_in_a_fresh_venv_and_trains_outside_the_tree(tmp_path):
    data = os.path.join(ROOT, "data", "fra-eng.zip")
    if not os.path.exists(data):
        pytest.skip(f"no dataset at {data}")
    src, wheels, venv, work = (tmp_path / n for n in ("src", "wheels", "venv", "work"))
    _checkout(src)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
          "-w", str(wheels), str(src)])
    (wheel,) = wheels.glob("d2l_transformer-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    missing = [f for f in _source_files() if f not in names]
    assert missing == [], f"not in the wheel: {missing}"

    # a fresh venv: the wheel itself (not editable), and the dependencies of this venv visible
    # through a path line in a .pth, which does not run that directory's own .pth files (the
    # editable install's finder)
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = str(venv / "bin" / "python")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps",
          "--no-index", str(wheel)])
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    with open(os.path.join(site.stdout.strip(), "shared_dependencies.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["D2L_TRANSFORMER_DATA"] = data
    where = _run([python, "-c", "import d2l_transformer; print(d2l_transformer.__file__)"],
                 cwd=work, env=env).stdout.strip()
    assert where.startswith(str(venv)), where  # the installed copy, not the source tree

    script = str(venv / "bin" / "d2l-transformer")
    assert "train" in _run([script, "--help"], cwd=work, env=env).stdout
    r = _run([script, "train", "--preset", "tiny", "--epochs", "1", "--ctx", "cpu", "--quiet",
              "--out", str(work / "m")], cwd=work, env=env)
    assert "Go . => " in r.stdout
    r = _run([script, "translate", "--engine", "mxnet",
              "--model", str(work / "m"), "go ."], cwd=work, env=env)
    assert len(r.stdout.splitlines()) == 1
    # nothing written beside the model directory and its versions
    assert [n for n in os.listdir(work) if not n.startswith(".m.v-")] == ["m"]


def test_one_version_read_by_setup_and_the_package():
    """setup.py reads d2l_transformer/_version.py as text; the package re-exports it."""
    import d2l_transformer
    from d2l_transformer._version import __version__

    r = _run([sys.executable, "setup.py", "--version"], cwd=ROOT)
    assert r.stdout.split()[-1] == __version__ == d2l_transformer.__version__


def _imports(path):
    """``(line, [module, ..., name])`` for every module or name a package module imports,
    relative imports resolved: ``from .. import X`` in ``d2l_transformer/training/`` gives
    ``["d2l_transformer", "X"]``."""
    import ast

    rel = os.path.relpath(path, ROOT).replace(os.sep, "/")[:-3].split("/")
    package = rel[:-1]  # a module's package; an __init__'s own package
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name.split(".")) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                target = base + (node.module.split(".") if node.module else [])
            else:
                target = (node.module or "").split(".")
            yield from ((node.lineno, target + [a.name]) for a in node.names)


def _imports_of_the_face(path):
    """The lines of a package module that import the package's ``__init__`` (its face): ``import
    d2l_transformer``, ``from d2l_transformer import X`` or ``from .. import X`` resolving to the
    top package, where X is not a submodule."""
    submodules = {n[:-3] if n.endswith(".py") else n for n in os.listdir(PACKAGE)}
    return [line for line, parts in _imports(path) if parts == ["d2l_transformer"] or
            (len(parts) == 2 and parts[0] == "d2l_transformer" and parts[1] not in submodules)]


def test_no_module_imports_the_package_face():
    """Arrows point down: no module of the package imports its ``__init__`` (the version lives
    in ``_version.py`` on the ground floor)."""
    offenders = {f: lines for f in _source_files() if f.endswith(".py") and f !=
                 "d2l_transformer/__init__.py" and (lines := _imports_of_the_face(os.path.join(ROOT, f)))}
    assert offenders == {}


def test_the_core_imports_nothing_of_contrib():
    """`contrib/` is beyond the core: no module outside it imports it (what the core needs, the
    mean of parameter sets, is `training.averaging`)."""
    offenders = {f: line for f in _source_files() if f.endswith(".py") and
                 not f.startswith("d2l_transformer/contrib/")
                 for line, parts in _imports(os.path.join(ROOT, f))
                 if parts[:2] == ["d2l_transformer", "contrib"]}
    assert offenders == {}


def test_every_module_is_under_400_lines():
    """One job per module: no source file of the package reaches 400 lines."""
    long = {}
    for f in _source_files():
        with open(os.path.join(ROOT, f), encoding="utf-8") as source:
            if (n := sum(1 for _ in source)) >= 400:
                long[f] = n
    assert long == {}


MAX_CODE_LINES = 60  # per function


def _function_code_lines(path):
    """``{name: code lines}`` of every function in a module (``Class.method``,
    ``outer.inner``): the lines from its first decorator to its end, less blank lines,
    comment-only lines and its docstring."""
    import ast

    lines = open(path, encoding="utf-8").read().splitlines()
    found = {}

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name, doc = prefix + child.name, set()
                if ast.get_docstring(child, clean=False) is not None:
                    doc = set(range(child.body[0].lineno, child.body[0].end_lineno + 1))
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                n = sum(1 for i in range(first, child.end_lineno + 1) if i not in doc and
                        lines[i - 1].strip() and not lines[i - 1].strip().startswith("#"))
                found[name] = max(n, found.get(name, 0))  # a property's setter shares its name
                visit(child, name + ".")
            else:
                visit(child, prefix + child.name + "." if isinstance(child, ast.ClassDef) else prefix)

    visit(ast.parse("\n".join(lines)), "")
    return found


def test_every_function_is_at_most_60_code_lines():
    """Short functions: no function of the package has over 60 code lines (blank lines,
    comments and docstrings aside)."""
    lengths = {}
    for f in _source_files():
        if f.endswith(".py"):
            module = os.path.relpath(os.path.join(ROOT, f), PACKAGE).replace(os.sep, "/")
            lengths.update({f"{module}:{name}": n for name, n in
                            _function_code_lines(os.path.join(ROOT, f)).items()})
    long = {name: n for name, n in sorted(lengths.items()) if n > MAX_CODE_LINES}
    assert long == {}, f"over {MAX_CODE_LINES} code lines: split them into shorter functions"


# Gluon blocks' (and their ParameterDicts', Parameters', Trainers', optimizers') private
# attributes
GLUON_PRIVATE = {"_children", "_cached_op", "_cached_graph", "_clear_cached_op", "_rate",
                 "_epsilon", "_units", "_kwargs", "_reg_params", "_params", "_data",
                 "_updaters", "_collect_params_with_prefix", "_scope", "_flatten", "_param2idx",
                 "_contexts", "_kvstore_params", "_update_on_kvstore", "_amp_loss_scaler",
                 "_set_current_context", "_kv_initialized", "_init_kvstore", "_params_to_init",
                 "_init_params", "_kvstore", "_update_count", "_index_update_count", "_get_lrs",
                 "_get_wds"}
def test_gluon_block_internals_are_read_in_one_module():
    """Only `_gluon.py` reads or writes a Gluon block's private attributes (a new MXNet that
    renames one breaks that module only); everywhere else uses its functions or public API."""
    import ast

    found = set()
    for f in _source_files():
        if f.endswith(".py") and f != "d2l_transformer/_gluon.py":
            tree = ast.parse(open(os.path.join(ROOT, f), encoding="utf-8").read())
            found |= {(f, node.attr) for node in ast.walk(tree)
                      if isinstance(node, ast.Attribute) and node.attr in GLUON_PRIVATE}
    assert found == set()


def test_no_script_puts_a_path_on_sys_path():
    """The scripts import the installed package and one another by name (``python
    scripts/X.py`` puts scripts/ first on the path itself): none changes ``sys.path``."""
    import ast

    found = []
    scripts = os.path.join(ROOT, "scripts")
    for name in sorted(os.listdir(scripts)):
        if name.endswith(".py"):
            tree = ast.parse(open(os.path.join(scripts, name), encoding="utf-8").read())
            found += [(name, node.lineno) for node in ast.walk(tree)
                      if isinstance(node, ast.Attribute) and node.attr == "path"
                      and isinstance(node.value, ast.Name) and node.value.id == "sys"]
    assert found == []
