"""Flow-GRPO log-prob consistency: the first-inner-step importance ratio per dtype.

    python bench/bench_logprob_consistency.py [--device cuda] [--dtypes float32 bfloat16] [--json out.json]

Rolls out with the registered ``sana`` rollout (SDE sampler, stored log-probs), then recomputes
every step's log-prob with the registered ``sana_flow_grpo`` trainer from the same inputs. On-policy,
exp(log p_train − log p_rollout) must be 1; the JSON reports max |ratio − 1| per dtype (fp32 is
asserted to 1e-6 on the CPU by tests/test_trainer_grpo.py; this measures bf16 on the GPU).
"""

from __future__ import annotations

import argparse
import copy
import tempfile
from pathlib import Path

import torch
from benchlib import environment, write_json

RECIPE = Path(__file__).resolve().parents[1] / "toml/tiny/sana-image-grpo.toml"
PROMPTS = ["a red apple", "a blue car", "a cat on a sofa", "a lighthouse at night"]


def max_ratio_error(pipeline: Path, dtype: str, device: str, size: int, output_dir: Path) -> dict[str, float]:
    from cosmos_rl.dispatcher.data.schema import RLPayload
    from cosmos_rl.utils.payload import extract_rollouts

    from cosmos_sana.compat.cosmos_rl import cosmos_config_class
    from cosmos_sana.validation import load_toml
    from cosmos_sana_plugins.trainers.local_loop import build_components
    from cosmos_sana_plugins.trainers.rl import RolloutBatch

    data = load_toml(RECIPE)
    data["policy"]["model_name_or_path"] = str(pipeline)
    data["policy"]["diffusers"]["dtype"] = dtype
    data["policy"]["diffusers"]["inference_size"] = [size, size]
    data["train"]["param_dtype"] = dtype
    data["train"]["output_dir"] = str(output_dir)
    data["custom"].setdefault("model", {})["device"] = device
    config = cosmos_config_class().from_dict(copy.deepcopy(data))
    trainer, rollout = build_components(config)
    with torch.no_grad():  # a non-trivial LoRA so that policy and reference differ
        for name, param in trainer.model.transformer.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn_like(param) * 0.05)
    payloads = [RLPayload(prompt={"prompt": p, "metadata": {}}, prompt_idx=i) for i, p in enumerate(PROMPTS)]
    rollouts = []
    for payload, result in zip(payloads, rollout.rollout_generation(payloads, None, None, None)):
        n = len(result.completions)
        payload.completions, payload.extra_info = result.completions, result.extra_info
        payload.rewards, payload.advantages, payload.filter_rewards = [0.0] * n, [0.0] * n, [0.0] * n
        payload.report_metrics = [{} for _ in range(n)]
        rollouts += extract_rollouts([payload], False)[0]
    batch = RolloutBatch.collate(rollouts, trainer.device)
    index = torch.arange(batch.size, device=trainer.device)
    errors = []
    with torch.no_grad():
        for j in range(batch.num_steps):
            log_prob, _, _ = trainer.step_log_prob(batch, index, torch.full((batch.size,), j, device=trainer.device))
            ratio = torch.exp(log_prob.double() - batch.log_probs[:, j].double())
            errors.append((ratio - 1).abs().max().item())
    return {"max_abs_ratio_minus_1": max(errors), "per_step": errors, "samples": batch.size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--preset", default="tiny", help="cosmos_sana.tools.tiny preset of the random pipeline")
    parser.add_argument("--size", type=int, default=32, help="image size in pixels")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from cosmos_sana.tools.tiny import build_pipeline

    with tempfile.TemporaryDirectory() as scratch:
        pipeline = build_pipeline(Path(scratch) / "pipeline", preset=args.preset, device=args.device)
        results = {
            dtype: max_ratio_error(pipeline, dtype, args.device, args.size, Path(scratch) / f"run-{dtype}") for dtype in args.dtypes
        }
    write_json({"bench": "logprob_consistency", "env": environment(torch.device(args.device)), "preset": args.preset, "size": args.size, "results": results}, args.json)


if __name__ == "__main__":
    main()
