"""Train the built-in demo model (core/headgraph/core/data/demo): a 2-layer attention-only copier.

Each training sequence is random filler tokens followed by a random block and its copy; the
block length varies per sequence, so no fixed positional offset can solve the copy and the
model must learn induction (a previous-token head in layer 0 feeding an induction head in
layer 1). Loss is taken only where the copy is predictable: on the copied block, from its
first token onward, predicting the next copied token.

    .venv/bin/python scripts/train_demo.py [--steps 3000] [--seed 0] [--out core/headgraph/core/data/demo]
    .venv/bin/python scripts/train_demo.py --checkpoints 7 \
        --checkpoint-dir core/headgraph/core/data/demo_series

Seeded, one CPU thread, a few minutes. It prints and checks that Projection Kernel's top
O->K edge runs from a previous-token head to an induction head. ``--checkpoints N`` also saves
the model at N log-spaced steps (the last one is ``--steps``) into ``DIR/step-<step>`` in the
demo's own format: the same seed and recipe as the shipped demo, so the series shows its
induction edge L0H0 -> layer 1 forming (the ``demo-series`` model series). With
``--checkpoint-dir`` the final model is written to ``--out`` only when ``--out`` is given.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from headgraph.core.activations.patterns import pattern_scores
from headgraph.core.models.demo import DEMO_DIR, DemoConfig, DemoModel, save_demo_model


def copy_batch(batch: int, seq_len: int, vocab: int, min_block: int, max_block: int,
               gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [batch, seq_len], loss mask [batch, seq_len - 1]) of filler + block + copy.

    The mask marks input positions inside the copy whose next token is also in the copy.
    """
    tokens = torch.randint(vocab, (batch, seq_len), generator=gen)
    block = torch.randint(min_block, max_block + 1, (batch, 1), generator=gen)
    pos = torch.arange(seq_len)[None, :]
    copy_start = seq_len - block  # copy occupies [seq_len - b, seq_len)
    src = torch.where(pos >= copy_start, pos - block, pos)
    tokens = torch.gather(tokens, 1, src)
    inp = pos[:, :-1]
    mask = (inp >= copy_start) & (inp <= seq_len - 2)
    return tokens, mask


def copy_loss(model: DemoModel, tokens: torch.Tensor, mask: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean cross-entropy, accuracy) over the masked (predictable copy) positions."""
    logits = model(tokens)[:, :-1]
    target = tokens[:, 1:]
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="none")
    loss = (ce * mask).sum() / mask.sum()
    acc = ((logits.argmax(-1) == target) & mask).sum() / mask.sum()
    return loss, acc


def ok_scores_float64(model: DemoModel) -> torch.Tensor:
    """PK between layer-0 O and layer-1 K subspaces, [H, H], float64 reference (QR bases)."""
    O = model.W_O[0].detach().double().transpose(-2, -1)  # [H, d_model, d_head]
    K = model.W_K[1].detach().double()
    U_o = torch.linalg.qr(O).Q
    U_k = torch.linalg.qr(K).Q
    return (torch.einsum("adi,bdj->abij", U_o, U_k) ** 2).sum(dim=(-2, -1))


def checkpoint_steps(n: int, steps: int) -> list[int]:
    """``n`` distinct log-spaced steps from ``steps // 100`` (at least 1) to ``steps``."""
    if n < 1:
        return []
    first = max(1, steps // 100)
    if n == 1:
        return [steps]
    ratio = (steps / first) ** (1 / (n - 1))
    out = sorted({min(steps, round(first * ratio ** i)) for i in range(n)} | {steps})
    return out


def training_recipe(args: argparse.Namespace, seq_len: int, min_block: int, max_block: int
                    ) -> dict[str, object]:
    """The recipe config.json records (shipped demo and every checkpoint)."""
    return {
        "task": "random filler, then a random block and its copy; block length "
                f"uniform in [{min_block}, {max_block}], sequence length {seq_len}",
        "loss": "cross-entropy on predictable copy positions only",
        "positions": "shortformer: W_pos added to query/key inputs only",
        "optimizer": f"AdamW lr {args.lr} (one-cycle), weight decay 0.01, grad clip 1.0",
        "batch": args.batch, "steps": args.steps, "seed": args.seed,
        "script": "scripts/train_demo.py",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--out", type=Path, default=None,
                        help="where the final model goes (default: the shipped demo's folder, "
                             "or nowhere with --checkpoint-dir)")
    parser.add_argument("--checkpoints", type=int, default=0,
                        help="save the model at this many log-spaced steps")
    parser.add_argument("--checkpoint-dir", type=Path, default=None,
                        help="folder of the step-<step> checkpoints")
    args = parser.parse_args()
    if args.checkpoints and args.checkpoint_dir is None:
        parser.error("--checkpoints needs --checkpoint-dir")
    if args.out is None and args.checkpoint_dir is None:
        args.out = DEMO_DIR
    save_at = set(checkpoint_steps(args.checkpoints, args.steps))

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    cfg = DemoConfig()
    seq_len, min_block, max_block = cfg.n_ctx, 4, cfg.n_ctx // 2
    model = DemoModel(cfg, seed=args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.steps,
                                                pct_start=0.05)
    gen = torch.Generator().manual_seed(args.seed + 1)
    start = time.time()
    for step in range(1, args.steps + 1):
        tokens, mask = copy_batch(args.batch, seq_len, cfg.d_vocab, min_block, max_block, gen)
        loss, acc = copy_loss(model, tokens, mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step in save_at:
            recipe = training_recipe(args, seq_len, min_block, max_block)
            save_demo_model(model, args.checkpoint_dir / f"step-{step}",
                            extra={"training": {**recipe, "checkpoint_step": step}})
        if step % 250 == 0 or step == 1:
            print(f"step {step:5d}  loss {loss.item():.4f}  copy acc {acc.item():.3f}  "
                  f"{time.time() - start:.0f}s", flush=True)

    model.eval().requires_grad_(False)
    eval_gen = torch.Generator().manual_seed(args.seed + 12345)
    tokens, mask = copy_batch(512, seq_len, cfg.d_vocab, min_block, max_block, eval_gen)
    with torch.no_grad():
        loss, acc = copy_loss(model, tokens, mask)
    scores = pattern_scores(model, seed=args.seed)
    ok = ok_scores_float64(model)
    src, dst = divmod(int(ok.argmax()), cfg.n_heads)
    prev = scores.previous_token[0]
    ind = scores.induction[1]
    print(f"final copy loss {loss.item():.4f}, accuracy {acc.item():.4f}")
    print("layer-0 previous-token scores:", [round(v, 2) for v in prev.tolist()])
    print("layer-1 induction scores:     ", [round(v, 2) for v in ind.tolist()])
    print(f"top PK OK edge: L0H{src} -> L1H{dst}  (PK {ok.max().item():.3f}; "
          f"prev-token {prev[src].item():.2f}, induction {ind[dst].item():.2f})")
    if not (prev[src] > 0.5 and ind[dst] > 0.5):
        raise SystemExit("top OK edge is not previous-token -> induction; not saving")

    if args.out is None:
        print(f"checkpoints at steps {sorted(save_at)} in {args.checkpoint_dir}")
        return
    save_demo_model(model, args.out, extra={
        "training": training_recipe(args, seq_len, min_block, max_block),
        "results": {
            "copy_loss": round(loss.item(), 5), "copy_accuracy": round(acc.item(), 5),
            "top_ok_edge": [[0, src], [1, dst]],
            "previous_token_head": [0, int(prev.argmax())],
            "induction_head": [1, int(ind.argmax())],
        },
    })
    print(f"saved to {args.out}")


if __name__ == "__main__":
    main()
