"""Per-step gradient norms: batched VJPs against one backward per step, and the reachability statistic.

1. Speed, on the tiny Qwen2 policy: K = 4, 8, 16 steps of one trajectory, timed in one run: the batched
   backward (`step_grad_norms`), the naive loop (`step_grad_norms_loop`) and, for scale, one plain backward of
   the summed loss (which cannot give per-step norms); wall clock at torch's thread count, and the ratio again
   in CPU time of a single thread.
2. Speed across trajectories: the greedy solutions of `--problems` held-out problems (what the curator measures
   each iteration: many short trajectories of a few steps), one trajectory per pass (rows_per_pass=1, as
   before trajectories were batched) against 16, 32 and 64 per pass.
3. Where one call's time goes: the CPU time of the batched norms of those solutions under the curator's default
   CCM estimate, by operator family (torch.profiler's self time; on a CPU only).
4. Behaviour: mean reachability, under a warmed-up tiny Qwen2 policy, of the steps of its own greedy solutions
   and of the same number of steps written by a policy of the same family that never saw the task; alpha is
   calibrated on the policy's own steps.

    python -m benchmarks.reachability_bench [--warmup-scale 0.3] [--problems 64] [--device cuda] [--repeats 7]
"""

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

import diagnosis
import grad_norms
import reachability
from benchmarks.timing import best_of
from testbed import arith
from testbed import policies
from testbed import presets
from testbed import tiny

FAMILIES = {   # torch operators by what they do; the rest is reported as "other"
    "matrix products": {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"},
    "elementwise multiplies and adds": {"aten::mul", "aten::mul_", "aten::add", "aten::add_", "aten::addcmul_",
                                        "aten::sub", "aten::neg", "aten::div", "aten::pow", "aten::rsqrt",
                                        "aten::mean", "aten::sum", "aten::silu", "aten::silu_backward"},
    "copies, fills and concatenations": {"aten::copy_", "aten::fill_", "aten::zero_", "aten::cat", "aten::clone",
                                         "aten::contiguous", "aten::empty", "aten::zeros", "aten::index_select",
                                         "aten::index", "aten::index_put_", "aten::masked_fill"},
}


def print_profile(model: torch.nn.Module, solutions: tuple) -> None:
    """Section 3: the self CPU time of one batched call under the default CCM estimate, by operator family."""
    estimate = diagnosis.CuratorConfig.ccm_estimate
    params, modules = grad_norms.ccm_scope(model, estimate)
    grad_norms.step_grad_norms(model, *solutions, params, modules)   # warm the allocator before profiling
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        grad_norms.step_grad_norms(model, *solutions, params, modules)
    self_us = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    total = sum(self_us.values())
    shares = {family: sum(us for op, us in self_us.items() if op in ops) / total for family, ops in FAMILIES.items()}
    shares["other"] = 1 - sum(shares.values())
    print(f"\n| {estimate} norms of {len(solutions[2])} solutions ({sum(map(len, solutions[2]))} steps): "
          f"{total / 1e3:.0f} ms of self CPU time | share |\n|---|---|")
    for family, share in shares.items():
        print(f"| {family} | {share:.0%} |")
    top = sorted(self_us.items(), key=lambda kv: -kv[1])[:8]
    print("largest operators: " + ", ".join(f"{op} {us / total:.0%}" for op, us in top))


def main() -> None:
    cli = argparse.ArgumentParser()
    cli.add_argument("--warmup-scale", type=float, default=0.3)
    cli.add_argument("--problems", type=int, default=64)
    cli.add_argument("--repeats", type=int, default=7, help="timings per measurement; the fastest is kept")
    cli.add_argument("--device", default="cpu", help="e.g. cuda: the timings then synchronize the device")
    args = cli.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    cfg = arith.TaskConfig()
    spec = presets.PRESETS["tiny"]["qwen-llama"][0]
    policy = policies.load_tiny_policy(spec, cfg, seed=1, cache_dir=None, warmup_scale=args.warmup_scale)
    model = policy.model.to(device)
    policy.device = device
    params = grad_norms.parameter_subset(model, "all")

    def packed(trajectories) -> tuple[torch.Tensor, torch.Tensor, list]:
        input_ids, attention, spans = reachability.batch_inputs(trajectories, policy.tokenizer.pad_token_id)
        return input_ids.to(device), attention.to(device), spans

    print("| steps K | batched (ms) | loop (ms) | batched / loop | one summed backward (ms) "
          "| batched / loop, CPU time, 1 thread |\n|---|---|---|---|---|---|")
    threads = torch.get_num_threads()
    for k in (4, 8, 16):
        steps = [(4 * i, 4 * i + 4) for i in range(k)]
        ids = torch.randint(len(policy.tokenizer), (40 + 4 * k + 1,)).tolist()
        inputs = packed([(ids[:40], ids[40:], steps)])

        def batched() -> None:
            grad_norms.step_grad_norms(model, *inputs, params)

        def loop() -> None:
            grad_norms.step_grad_norms_loop(model, *inputs, params)

        def summed() -> None:
            losses, _ = grad_norms.step_losses(model, *inputs)
            torch.autograd.grad(losses.sum(), params)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        wall = {fn: best_of(args.repeats, fn) for fn in (batched, loop, summed)}
        cpu_ratio = "—"
        if device.type == "cpu":  # the CPU time of one thread is what other users of a shared machine disturb least
            torch.set_num_threads(1)
            cpu = {fn: best_of(args.repeats, fn, time.thread_time) for fn in (batched, loop)}
            torch.set_num_threads(threads)
            cpu_ratio = f"{cpu[batched] / cpu[loop]:.2f}"
        print(f"| {k} | {wall[batched] * 1e3:.1f} | {wall[loop] * 1e3:.1f} | {wall[batched] / wall[loop]:.2f} "
              f"| {wall[summed] * 1e3:.1f} | {cpu_ratio} |")

    problems = arith.generate_problems(args.problems, "heldout", 3, cfg)
    solutions = packed(reachability.solution_steps(policy, policy, problems))
    print(f"\n| trajectories per pass | ms for {len(solutions[2])} solutions ({sum(map(len, solutions[2]))} steps) "
          "| against one per pass |\n|---|---|---|")
    one = None
    for rows in (1, 16, 32, 64):
        ms = 1e3 * best_of(max(1, args.repeats // 2),
                           lambda: grad_norms.step_grad_norms(model, *solutions, params, rows_per_pass=rows))
        one = one or ms
        print(f"| {rows} | {ms:.0f} | {one / ms:.1f}x |")

    if device.type == "cpu":
        print_profile(model, solutions)

    untrained = policies.Policy("untrained",
                                tiny.tiny_model(spec.family, spec.tiny, len(policy.tokenizer), 99).to(device),
                                policy.tokenizer, use_chat_template=False)
    own = grad_norms.step_grad_norms(model, *solutions, params)
    foreign = grad_norms.step_grad_norms(model, *packed(reachability.solution_steps(policy, untrained, problems)),
                                           params)
    count = min(len(own), len(foreign))
    cfg = diagnosis.CuratorConfig()
    calibration = reachability.calibrate(own, cfg.reach_quantile, cfg.reach_zero_quantile)
    own_r, foreign_r = (reachability.reachability(x[:count], calibration) for x in (own, foreign))
    print(f"\n{count} steps each; zero point g = {calibration.zero:.2f}, alpha = {calibration.alpha:.4f}")
    print(f"own greedy steps:      mean g = {own[:count].mean():.2f}, mean R = {own_r.mean():.3f}")
    print(f"never-trained policy:  mean g = {foreign[:count].mean():.2f}, mean R = {foreign_r.mean():.3f}")


if __name__ == "__main__":
    main()
