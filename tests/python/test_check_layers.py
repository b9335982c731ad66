"""scripts/check-layers.py: passes on this tree, and fails on a tree with one arrow pointing the
wrong way (each kind of violation it knows, one at a time)."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "check-layers.py")

# A well-layered tree in miniature: core uses shmipc.h's types and internal calls only.
CLEAN = {
    "core/common/error.h": '#include "shmipc.h"\nconst char *shmipc__detail(void);\n',
    "core/shm/queue.c": '#include "common/error.h"\nint q(void) { return SHMIPC_EINVAL; }\n',
    "core/ipc/session.c": (
        '#include "shmipc.h"\n#include "common/error.h"\n#include "shm/queue.h"\n'
        "/* shmipc_session_close() in a comment is fine */\n"
        'static const char *s = "shmipc_errname(x) in a string is fine";\n'
        "int f(shmipc_config *cfg) { (void)cfg; return shmipc__detail() != 0; }\n"),
    "core/shm/queue.h": "int q(void);\n",
    "core/net/server.c": '#include "reactor/loop.h"\n',
    "core/reactor/loop.h": "\n",
    "bindings/error.c": (
        '#include "shmipc.h"\n#include "common/error.h"\n'
        "SHMIPC_API const char *shmipc_error_detail(void)\n{\n    return shmipc__detail();\n}\n"),
    "lua/shmipc.c": "#include <shmipc.h>\n#include \"lshmipc.h\"\nint shmipc__lua_x(void);\n",
    "lua/lshmipc.h": "#include <shmipc.h>\n",
    "python/shmipc/module.h": "#include <shmipc.h>\n",
    "python/meson.build": "py_dep = declare_dependency(include_directories: public_inc)\n",
}

# name: (file, text, a phrase of the message)
BAD = {
    "core calls a public function": (
        "core/ipc/manager.c", "void g(shmipc_session *s) { shmipc_session_close(s); }\n",
        "shmipc_session_close"),
    "core takes a public function's address": (
        "core/ipc/manager.c", "static void *p = (void *)&shmipc_errname;\n", "shmipc_errname"),
    "core includes the ABI tables": (
        "core/ipc/manager.c", '#include "shmipc_abi.h"\n', "shmipc_abi.h"),
    "core includes a bindings file": (
        "core/net/x.c", '#include "../../bindings/helpers.h"\n', "helpers.h"),
    "shm includes ipc": ("core/shm/buffer.c", '#include "ipc/session.h"\n', "core/ipc"),
    "common includes shm": ("core/common/log.c", '#include "shm/queue.h"\n', "core/shm"),
    "net includes ipc": ("core/net/server.c", '#include "ipc/session.h"\n', "core/ipc"),
    "reactor includes net": ("core/reactor/uring.c", '#include "net/http.h"\n', "core/net"),
    "ipc includes reactor": ("core/ipc/listener.c", '#include "reactor/loop.h"\n', "core/reactor"),
    "core defines a public function": (
        "core/common/version.c", "SHMIPC_API int shmipc_version(void)\n{\n    return 1;\n}\n",
        "outside bindings"),
    "lua includes a core header": ("lua/stream.c", '#include "ipc/session.h"\n', "ipc/session.h"),
    "python includes core by path": (
        "python/shmipc/stream.c", '#include "../../core/common/error.h"\n', "error.h"),
    "python names a core internal": (
        "python/shmipc/stream.c", "#include <shmipc.h>\nint h(void) { return !shmipc__detail(); }\n",
        "shmipc__detail"),
    "lua meson gets the core include directory": (
        "lua/meson.build", "lib = library('x', include_directories: [public_inc, core_inc])\n",
        "core_inc"),
}


def run(root):
    return subprocess.run([sys.executable, SCRIPT, "--root", str(root)], capture_output=True,
                          text=True)


def make_tree(tmp_path, extra=None):
    root = tmp_path / "tree"
    (root / "bindings").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "bindings", "shmipc.h"), root / "bindings" / "shmipc.h")
    abi = os.path.join(ROOT, "bindings", "shmipc_abi.h")
    if os.path.exists(abi):
        shutil.copy(abi, root / "bindings" / "shmipc_abi.h")
    files = dict(CLEAN)
    files.update(extra or {})
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def test_this_tree_is_layered():
    r = run(ROOT)
    assert r.returncode == 0, r.stderr
    assert "layers:" in r.stdout


def test_clean_miniature_passes(tmp_path):
    r = run(make_tree(tmp_path))
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("case", sorted(BAD))
def test_wrong_arrow_fails(tmp_path, case):
    rel, text, phrase = BAD[case]
    r = run(make_tree(tmp_path, {rel: text}))
    assert r.returncode == 1, f"{case}: not caught\n{r.stdout}{r.stderr}"
    assert rel.split("/")[-1] in r.stderr and phrase in r.stderr, r.stderr
