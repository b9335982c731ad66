"""The .pyi stubs name every public class, method and property of the module (and nothing it
lacks), and every public method has a docstring that starts with its signature, so that
help(shmipc.Stream) is useful."""
import ast
import inspect
import os
import pydoc

import pytest

import shmipc
import shmipc.aio

PKG = os.path.dirname(shmipc.__file__)
IPC_CLASSES = ["Session", "Stream", "Chunk", "SessionManager", "Listener"]


def stub_tree(name):
    with open(os.path.join(PKG, name)) as f:
        return ast.parse(f.read())


def stub_members(tree):
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names = set()
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(item.name)
                elif isinstance(item, ast.AnnAssign):
                    names.add(item.target.id)
            out[node.name] = names
    return out


def runtime_members(cls):
    return {n for n in dir(cls) if not n.startswith("_") or n in ("__enter__", "__exit__")}


def test_every_exported_name_has_a_stub():
    tree = stub_tree("__init__.pyi")
    declared = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            declared.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            declared.add(node.target.id)
        elif isinstance(node, ast.Assign):
            declared.update(t.id for t in node.targets)
    assert set(shmipc.__all__) <= declared, set(shmipc.__all__) - declared


@pytest.mark.parametrize("name", IPC_CLASSES)
def test_stub_classes_match_the_runtime(name):
    members = stub_members(stub_tree("__init__.pyi"))
    cls = getattr(shmipc, name)
    stub = members[name] | members["_ContextManager"]
    runtime = runtime_members(cls)
    assert runtime - stub == set(), f"{name}: missing from the stub"
    extra = {n for n in stub - runtime if not n.startswith("__")}
    assert extra == set(), f"{name}: in the stub but not in the module"


def test_aio_stub_matches():
    members = stub_members(stub_tree("aio.pyi"))
    runtime = {n for n in dir(shmipc.aio.AsyncStream) if not n.startswith("_")}
    assert runtime == {n for n in members["AsyncStream"] if not n.startswith("_")}
    tree = stub_tree("aio.pyi")
    funcs = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    assert set(shmipc.aio.__all__) - {"AsyncStream"} <= funcs


@pytest.mark.parametrize("name", IPC_CLASSES)
def test_methods_have_docstrings_with_signatures(name):
    cls = getattr(shmipc, name)
    assert cls.__doc__ and len(cls.__doc__) > 100
    for attr in runtime_members(cls):
        if attr.startswith("__"):
            continue
        member = inspect.getattr_static(cls, attr)
        doc = getattr(member, "__doc__", None)
        assert doc, f"{name}.{attr} has no docstring"
        if callable(getattr(cls, attr)) and not isinstance(member, property):
            assert doc.startswith(attr + "("), f"{name}.{attr}: {doc[:40]!r}"


def test_help_of_stream_explains_the_conventions():
    text = pydoc.render_doc(shmipc.Stream, renderer=pydoc.plaintext)
    for words in ("read_chunk(max=0, *, nonblock=False)", "end of stream", "EndOfStreamError",
                  "returns None", "GIL", "BufferError", "one thread at a time", "Chunk"):
        assert words in text, words
