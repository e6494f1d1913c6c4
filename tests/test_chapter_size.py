"""The chapter's files read like the chapter: each of its blocks and functions in
attention.py, layers.py and model.py has at most 1.5x the code lines of the chapter's own
(oracles/chapter_0_11.py; d2l 0.11.4's own for the two blocks it imports from d2l 9.1), the
helpers a block needs in those files counted with it. The table is printed and must be the one
in docs/design.md, so that it cannot drift."""

import ast
import inspect
import os
import textwrap

import chapter_0_11 as book
import d2l

from d2l_transformer import attention, layers, model

LIMIT = 1.5
DESIGN = os.path.join(os.path.dirname(__file__), "..", "docs", "design.md")
ROWS = [  # (name, ours with its helpers, the chapter's)
    ("masked_softmax (d2l 9.1)", [attention.masked_softmax, attention._F], [d2l.masked_softmax]),
    ("DotProductAttention (d2l 9.1)", [attention.DotProductAttention], [d2l.DotProductAttention]),
    ("MultiHeadAttention", [attention.MultiHeadAttention, attention.repeat_valid_length],
     [book.MultiHeadAttention]),
    ("transpose_qkv", [attention.transpose_qkv], [book.transpose_qkv]),
    ("transpose_output", [attention.transpose_output], [book.transpose_output]),
    ("PositionWiseFFN", [layers.PositionWiseFFN], [book.PositionWiseFFN]),
    ("AddNorm", [layers.AddNorm], [book.AddNorm]),
    ("PositionalEncoding", [layers.PositionalEncoding, layers.positional_encoding_table],
     [book.PositionalEncoding]),
    ("EncoderBlock", [model.EncoderBlock], [book.EncoderBlock]),
    ("TransformerEncoder", [model.TransformerEncoder], [book.TransformerEncoder]),
    ("DecoderBlock", [model.DecoderBlock, model.causal_valid_length], [book.DecoderBlock]),
    ("TransformerDecoder", [model.TransformerDecoder], [book.TransformerDecoder]),
]


def code_lines(obj):
    """The lines of `obj`'s source that hold code: not blank, not a comment, not a docstring."""
    source = textwrap.dedent(inspect.getsource(obj))
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and ast.get_docstring(node):
            doc = node.body[0]
            docstrings.update(range(doc.lineno, doc.end_lineno + 1))
    return sum(1 for i, line in enumerate(source.splitlines(), 1)
               if line.strip() and not line.strip().startswith("#") and i not in docstrings)


def table():
    lines = ["| block or function | ours | the chapter's | ratio |", "|---|---|---|---|"]
    total = [0, 0]
    for name, ours, theirs in ROWS:
        a, b = sum(map(code_lines, ours)), sum(map(code_lines, theirs))
        total[0], total[1] = total[0] + a, total[1] + b
        lines.append(f"| `{name}` | {a} | {b} | {a / b:.2f} |")
    lines.append(f"| all | {total[0]} | {total[1]} | {total[0] / total[1]:.2f} |")
    return "\n".join(lines)


def test_each_chapter_block_is_at_most_one_and_a_half_times_the_chapter():
    text = table()
    print("\n" + text)
    for row in text.splitlines()[2:]:
        assert float(row.split("|")[4]) <= LIMIT, row
    with open(DESIGN, encoding="utf-8") as f:
        assert text in f.read(), "docs/design.md's line-count table is not the measured one:\n" + text


def test_the_chapter_files_import_only_mxnet_and_one_another():
    """No kernels, variants, decoding or training machinery in the chapter's files."""
    allowed = {"math", "mxnet", "mxnet.gluon", ".attention", ".layers"}
    for module in (attention, layers, model):
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if isinstance(node, ast.Import):
                assert {a.name for a in node.names} <= allowed, module.__name__
            elif isinstance(node, ast.ImportFrom):
                assert "." * node.level + (node.module or "") in allowed, module.__name__
