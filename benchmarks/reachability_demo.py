"""CCM on a real example (reachability.py's concept, §1.2): a stronger tiny policy's greedy solutions scored step by
step under the weaker one, each step's gradient norm g_k, its reachability R_k and its phantom advantage P_k, R
calibrated on the weaker policy's own steps as the curator calibrates it (diagnosis.CuratorConfig's quantiles).

    python -m benchmarks.reachability_demo [--warmup-scale 1.0] [--ccm-estimate exact]

It lives here, not under reachability.py's `__main__`, because it reads the curator's configuration, which imports
reachability.py: a demo there would close an import circle."""

import argparse

import torch

import diagnosis
from grad_norms import ccm_scope, step_grad_norms
from reachability import (batch_inputs, calibrate, phantom_advantage, reachability, solution_item,
                          solution_steps)
from testbed import arith, policies


def main() -> None:
    cli = argparse.ArgumentParser(description="CCM demo on the tiny qwen-llama pair")
    cli.add_argument("--warmup-scale", type=float, default=1.0, help="the tiny policies' warm-up budget factor")
    cli.add_argument("--ccm-estimate", default="exact", help="exact or last:N (ccm_scope)")
    args = cli.parse_args()
    cfg = arith.TaskConfig()
    pols = policies.load_policies("qwen-llama", "tiny", torch.device("cpu"), cfg, seed=1,
                                  warmup_scale=args.warmup_scale)
    heldout = arith.generate_problems(200, "heldout", 1, cfg)
    # greedy pass@1 on the arithmetic held-out problems, here rather than through eval.py, which imports the
    # curator's record
    accuracy = {p.name: sum(arith.answer_reward(q, text) for q, text in zip(
        heldout, p.rollout([arith.prompt_text(q) for q in heldout], 1, 40, greedy=True).texts)) / len(heldout)
        for p in pols}
    weak, strong = sorted(pols, key=lambda p: accuracy[p.name])
    print(f"held-out accuracy: {accuracy}; target (weaker) = {weak.name}, source = {strong.name}")

    scope = ccm_scope(weak.model, args.ccm_estimate)
    own = solution_steps(weak, weak, arith.generate_problems(32, "train", 5, cfg))
    own_norms = step_grad_norms(weak.model, *batch_inputs(own, weak.tokenizer.pad_token_id), *scope)
    curator_cfg = diagnosis.CuratorConfig()
    calibration = calibrate(own_norms, curator_cfg.reach_quantile, curator_cfg.reach_zero_quantile)
    print(f"calibration on {len(own_norms)} of {weak.name}'s own steps: zero point (quantile "
          f"{curator_cfg.reach_zero_quantile}) g = {calibration.zero:.2f}, quantile {curator_cfg.reach_quantile} = "
          f"{torch.quantile(own_norms, curator_cfg.reach_quantile):.2f}, alpha = {calibration.alpha:.4f}")
    solutions = strong.rollout([arith.prompt_text(q) for q in heldout[:4]], 1, 40, greedy=True)
    for q, text, written in zip(heldout[:4], solutions.texts, solutions.completion_ids):
        print(f"\n{q.question}\n{strong.name}'s solution, reward {arith.answer_reward(q, text):.0f}, "
              f"under {weak.name}:")
        item = solution_item(weak, strong, q, written)
        if item is None:
            print("   no line: nothing to score")
            continue
        norms = step_grad_norms(weak.model, *batch_inputs([item], weak.tokenizer.pad_token_id), *scope)
        reach = reachability(norms, calibration)
        phantom = phantom_advantage(torch.ones_like(reach), reach)
        _, ids, ranges = item
        for (a, b), g, r, p in zip(ranges, norms, reach, phantom):
            line = weak.decode(ids[a:b]).strip()
            print(f"   {line:<22} g = {g:6.2f}   R = {r:.2f}   P (A = 1) = {p:.2f}")


if __name__ == "__main__":
    main()
