"""``kit patches check`` (kit.checks.patch_compat): the patches' declared targets, read statically from a vLLM source
tree, against what the patches do at run time on the installed vLLM. No engine starts: vLLM modules are imported,
and each patch's ``_apply()`` runs with ``install`` replaced by a recorder (nothing is replaced)."""
from __future__ import annotations

import importlib
import inspect
import json
import shutil
import sys
from pathlib import Path

import pytest

from kit import patches
from kit.checks import patch_compat as pc
from kit.checks import vllm_tree

AUTH = "vllm.entrypoints.serve.middleware.authenticate"
TRITON = "vllm.utils.cpu_triton_utils"


@pytest.fixture(scope="module")
def installed():
    tree = vllm_tree.installed_tree()
    if tree is None or tree.version not in patches.SUPPORTED_VLLM:
        pytest.skip("needs the vLLM the patches target installed")
    return tree


def test_every_patch_applies_to_the_installed_vllm(installed):
    results = pc.check([installed], installed)
    assert set(results) == set(patches.INDEX)
    bad = {n: v[0].findings for n, v in results.items() if v[0].status not in (pc.APPLIES, pc.NOT_VLLM, pc.REPORT_ONLY)}
    assert not bad, bad
    assert all(f.status != pc.NOTE for v in results.values() for f in v[0].findings)   # the reference itself
    assert results["spec_no_pad_fresh_prompt"][0].status == pc.APPLIES
    assert results["draft_pp_gate"][0].status == pc.REPORT_ONLY
    assert results["tcp_store_bind_host"][0].status == pc.NOT_VLLM   # torch's, not vLLM's


def _runtime(symbol: str):
    """(owner, attr) of a declared ``module:qualname`` in this process (``attr`` None: the module itself)."""
    module, qualname = symbol.split(":")
    obj = importlib.import_module(module)
    if not qualname:
        return obj, None
    *path, attr = qualname.split(".")
    for part in path:
        obj = getattr(obj, part)
    return obj, attr


def _vllm_symbols(p: patches.Patch) -> list[str]:
    return [s for s in dict.fromkeys([*p.symbols, *(a.symbol for a in p.anchors)]) if s.startswith("vllm")]


def test_static_resolution_and_anchor_texts_agree_with_the_running_vllm(installed):
    """Every declared vLLM symbol exists at run time, and each anchor text is (or is not) in ``inspect.getsource``
    of it exactly as the static check found it in the file: the check reads what the patches read."""
    for name, p in patches.registry().items():
        for symbol in _vllm_symbols(p):
            owner, attr = _runtime(symbol)
            assert attr is None or hasattr(owner, attr), (name, symbol)
            assert installed.resolve(*symbol.split(":")) is not None, (name, symbol)
        for a in p.anchors:
            if not a.text or not a.symbol.startswith("vllm"):
                continue
            owner, attr = _runtime(a.symbol)
            obj = inspect.unwrap(owner if attr is None else getattr(owner, attr))
            if patches.marked(obj):  # replaced outright by a patch applied earlier in this process
                continue
            site = installed.resolve(*a.symbol.split(":"))
            static = installed.source(site)
            if inspect.ismodule(obj) or inspect.isclass(obj) or inspect.isfunction(obj) or inspect.ismethod(obj):
                runtime = inspect.getsource(obj)
            else:  # a value (NixlPushConnectorWorker._TRANSFER_MODE): as its source writes it
                runtime = json.dumps(obj) if isinstance(obj, str) else repr(obj)
            assert (a.text in runtime) == (a.text in static) == a.present, (name, a)


# Declared, but not replaced through install(): set directly, or only once the library loads.
NOT_INSTALLED = {
    ("cpu_ray_executor", "vllm.platforms.cpu:CpuPlatform.ray_device_key"),  # a class attribute set by _apply
    ("nixl_progress_delay", "nixl._api:nixlBind"),  # patched when vLLM loads nixl's API module
}
NO_INSTALL = {"cpu_amx_permission": "calls torch only", "qwen_vl_no_torchvision": "an import hook, replaces nothing"}


def test_each_patch_replaces_exactly_its_declared_symbols(monkeypatch):
    """``_apply()`` of every patch with ``install`` recording instead of replacing: what it replaces is what its
    ``symbols`` declare (the list ``kit patches check`` resolves), neither more nor less."""
    from vllm.platforms.cpu import CpuPlatform

    import vllm.v1.executor.ray_executor_v2  # noqa: F401  (ray_store_bind_host patches it where it is loaded)

    monkeypatch.setattr(CpuPlatform, "ray_device_key", CpuPlatform.ray_device_key)  # cpu_ray_executor sets it
    # A registry state of its own: the recorded applications must not count as applied for the tests after it.
    monkeypatch.setattr(patches, "STATE", patches._State())
    for name, p in patches.registry().items():
        if p.report_only or name in NO_INSTALL:
            continue
        mod = sys.modules[f"kit.patches.{name}"]
        calls: list[tuple] = []
        monkeypatch.setattr(mod, "install", lambda owner, attr, patch, make, c=calls: c.append((owner, attr)) or True)
        p.apply()
        done = {(id(o), a) for o, a in calls}
        declared = {}
        for s in p.symbols:
            try:
                owner, attr = _runtime(s)
            except ImportError:
                continue  # e.g. nixl._api where nixl is not installed
            declared[(id(owner), attr)] = s
        extra = [f"{getattr(o, '__name__', o)}.{a}" for o, a in calls if (id(o), a) not in declared]
        assert not extra, (name, "replaces undeclared", extra)
        missing = [s for k, s in declared.items() if k not in done and (name, s) not in NOT_INSTALLED]
        assert not missing, (name, "declares but does not replace", missing)


# -- a vLLM tree with one file, changed -----------------------------------------------------------------

def _tree(tmp_path: Path, installed, module: str, edit=None, extra: dict[str, str] | None = None) -> vllm_tree.Tree:
    """A source tree holding ``module``'s file copied from the installed vLLM (``edit``-ed) and ``extra`` modules."""
    root = tmp_path / "src"
    files = {module: (installed.module(module).path.read_text(), edit)}
    for m, text in (extra or {}).items():
        files[m] = (text, None)
    for m, (text, change) in files.items():
        f = root / Path(*m.split(".")).with_suffix(".py")
        for d in [f.parent, *f.parent.parents]:
            if d == root:
                break
            d.mkdir(parents=True, exist_ok=True)
            (d / "__init__.py").touch()
        f.write_text(change(text) if change else text)
    return vllm_tree.Tree(root)


def _verdict(name: str, tree: vllm_tree.Tree, reference) -> pc.Verdict:
    return pc.check_patch(patches.registry()[name], tree, reference)


def test_one_file_copied_unchanged_applies(tmp_path, installed):
    v = _verdict("api_key_every_route", _tree(tmp_path, installed, AUTH), installed)
    assert v.status == pc.APPLIES, v.findings


def test_a_class_moved_to_another_module_is_target_moved_with_where(tmp_path, installed):
    src = installed.module(AUTH).text
    cls = src[src.index("class AuthenticationMiddleware"):]
    moved = AUTH.rpartition(".")[0] + ".auth"
    tree = _tree(tmp_path, installed, AUTH, edit=lambda t: t.replace(cls, ""),
                 extra={moved: src.replace(cls, "") + "\n" + cls})
    v = _verdict("api_key_every_route", tree, installed)
    assert v.status == pc.MOVED, v.findings
    f = next(f for f in v.findings if f.symbol.endswith("AuthenticationMiddleware.__call__"))
    assert f.status == pc.MOVED and f"{moved}:AuthenticationMiddleware.__call__" in f.detail


def test_a_function_moved_and_imported_back_is_target_moved(tmp_path, installed):
    """vLLM 0.33 moved KV cache planning out of kv_cache_utils that way: the old module imports the functions, so
    replacing its attribute reaches no caller of the new module."""
    src = installed.module(TRITON).text
    start = src.index("def _expand_kernel_impl")
    end = src.find("\ndef ", start + 1)
    body = src[start:] if end < 0 else src[start:end]
    tree = _tree(tmp_path, installed, TRITON,
                 edit=lambda t: t.replace(body, "from vllm.utils.expand_ops import _expand_kernel_impl\n"),
                 extra={"vllm.utils.expand_ops": "import torch\n\n\n" + body})
    v = _verdict("cpu_rejection_expand", tree, installed)
    assert v.status == pc.MOVED, v.findings
    assert "now defined in vllm.utils.expand_ops:_expand_kernel_impl" in v.findings[0].detail


def test_a_renamed_class_is_target_gone(tmp_path, installed):
    tree = _tree(tmp_path, installed, AUTH, edit=lambda t: t.replace("AuthenticationMiddleware", "BearerMiddleware"))
    v = _verdict("api_key_every_route", tree, installed)
    assert v.status == pc.GONE and all(f.status == pc.GONE for f in v.findings), v.findings


def test_a_missing_module_is_target_gone(tmp_path, installed):
    tree = _tree(tmp_path, installed, TRITON)
    v = _verdict("api_key_every_route", tree, installed)
    assert v.status == pc.GONE and "no module " + AUTH in v.findings[0].detail


def test_the_text_at_the_fixed_spot_changed(tmp_path, installed):
    tree = _tree(tmp_path, installed, AUTH, edit=lambda t: t.replace("GUARDED_PREFIX", "PROTECTED_PREFIXES"))
    v = _verdict("api_key_every_route", tree, installed)
    assert v.status == pc.CHANGED and "'GUARDED_PREFIX'" in v.findings[0].detail, v.findings


def test_a_fix_that_arrived_upstream_is_code_changed(tmp_path, installed):
    """cpu_rejection_expand's detection reads a copy back (``copy_``) as the fix being upstream."""
    tree = _tree(tmp_path, installed, TRITON, edit=lambda t: t.replace(
        "        replace_to,\n    )\n\n\ndef _sample",
        "        replace_to,\n    )\n    output.copy_(output)\n\n\ndef _sample"))
    v = _verdict("cpu_rejection_expand", tree, installed)
    assert v.status == pc.CHANGED and any("is there now" in f.detail for f in v.findings), v.findings


def test_changed_parameters_and_a_changed_copied_definition(tmp_path, installed):
    sig = "def __call__(self, scope: Scope, receive: Receive, send: Send)"
    assert sig in installed.module(AUTH).text
    tree = _tree(tmp_path, installed, AUTH, edit=lambda t: t.replace(sig, sig.replace("send: Send", "send: Send, "
                                                                                       "path: str = ''")))
    v = _verdict("api_key_every_route", tree, installed)
    assert v.status == pc.CHANGED and "(self, scope, receive, send, path=…) here" in v.findings[0].detail
    assert _verdict("api_key_every_route", tree, None).status == pc.APPLIES   # no reference: not compared

    copy = patches.Patch(name="copy", summary="s", why="w", upstream="u", target="t", symbols=(),
                         processes=set(), runner=patches.Runner.ANY, kind=patches.Kind.START_UP, removal="r",
                         tests=(), apply=lambda: None, needed=lambda: True,
                         anchors=(patches.Anchor(AUTH + ":AuthenticationMiddleware.verify_token", whole=True),))
    same = _tree(tmp_path / "same", installed, AUTH)
    assert pc.check_patch(copy, same, installed).status == pc.APPLIES
    edited = _tree(tmp_path / "edited", installed, AUTH,
                   edit=lambda t: t.replace("return token_match", "return bool(token_match)"))
    assert pc.check_patch(copy, edited, installed).status == pc.CHANGED


def test_the_command_writes_its_table_and_refuses_a_missing_tree(tmp_path, installed, capsys):
    from kit.cli.main import main

    out = tmp_path / "compat.md"
    unpacked = tmp_path / "unpacked"
    shutil.copytree(_tree(tmp_path, installed, AUTH).root, unpacked)
    rc = main(["patches", "check", "--vllm-src", str(installed.root), "--vllm-src", str(unpacked),
               "--write", str(out)])
    assert rc == 1   # the one-file tree lacks most targets
    text = out.read_text()
    assert "<!-- results:begin kit patches check vllm-src=" in text and "Command: `kit patches check --vllm-src" in text
    assert f"| patch | {installed.label} | vllm unknown version |" in text
    assert "| `api_key_every_route` | applies | applies |" in text
    capsys.readouterr()
    assert main(["patches", "check", "--vllm-src", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"kit patches check: error: --vllm-src {tmp_path / 'nowhere'}: no such directory"], err
