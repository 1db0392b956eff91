#!/usr/bin/env python3
"""Generates the allocation traces shipped under tests/data/ (see docs/traces.md).

Each trace is the device-allocator event stream of a few GPT-2 training steps
as PyTorch would issue it: model setup, then per step the inputs, a forward
pass that allocates every layer's activations (QKV, attention scores,
softmax, dropout masks, MLP hidden, ...), a backward pass that allocates
gradients and frees the saved activations in reverse layer order, gradient
clipping, an Adam(W) step with its foreach temporaries, and zero_grad. The
batch size changes part-way through the run; in the long-context trace the
sequence length changes every step instead.

The tensor list follows Hugging Face's GPT2LMHeadModel under torch 2.x; sizes
are exact for the stated shapes and dtypes (fp16/bf16 = 2 bytes). Addresses
are unique ids, not real pointers; stream is always 0; time advances 1 us per
event plus the bytes at 2 TB/s.

Output: CSV `action,ptr,size,stream,time_ns`, one event per line, with a
header line. Plain Python 3 standard library; deterministic.

    python3 tools/tracegen/make_traces.py            # writes tests/data/*.csv
    python3 tools/tracegen/make_traces.py --out DIR  # elsewhere
    python3 tools/tracegen/make_traces.py --v3-sample FILE  # only a small
        # format-version-3 trace (ops, chunk uses), for the C++ reader's tests

The binary writers here follow docs/trace-format.md alone, independently of
the C++ writer, so the tests check the page as well as the code.
"""

import argparse
import os
import struct
import sys
import zlib

SEQ = 1024
VOCAB = 50257
FP32 = 4
HALF = 2  # fp16 or bf16
INT64 = 8
BOOL = 1


class Trace:
    """The event stream of one run, with a check that frees match allocs."""

    def __init__(self, name):
        self.name = name
        self.lines = []
        self.next_id = 0
        self.time_ns = 0
        self.live = {}  # id -> size
        self.live_bytes = 0
        self.peak_live_bytes = 0

    def _advance(self, size):
        self.time_ns += 1000 + size // 2000

    def alloc(self, size):
        assert size > 0
        self.next_id += 1
        ptr = 0x7F0000000000 + self.next_id * 0x1000
        self.live[ptr] = size
        self.live_bytes += size
        self.peak_live_bytes = max(self.peak_live_bytes, self.live_bytes)
        self._advance(size)
        self.lines.append(f"alloc,{ptr:#x},{size},0,{self.time_ns}")
        return ptr

    def free(self, ptr):
        size = self.live.pop(ptr)  # KeyError: a double free in the model below
        self.live_bytes -= size
        self._advance(0)
        self.lines.append(f"free,{ptr:#x},{size},0,{self.time_ns}")

    def free_all(self, ptrs):
        for ptr in ptrs:
            self.free(ptr)

    def write(self, path):
        with open(path, "w", newline="\n") as out:
            out.write("action,ptr,size,stream,time_ns\n")
            out.write("\n".join(self.lines))
            out.write("\n")


class Gpt2Run:
    """GPT-2 training on one GPU.

    precision "amp": fp32 parameters, autocast to fp16, GradScaler, Adam.
    precision "bf16": bf16 parameters and gradients, fp32 master weights and
    AdamW state in the optimizer (the usual mixed-precision optimizer).
    attention "eager": HF's matmul/softmax attention, materializing the
    (batch, heads, seq, seq) scores; "sdpa": flash attention (no scores).
    """

    def __init__(self, trace, layers, d_model, heads, precision, attention, max_seq=SEQ):
        self.t = trace
        self.max_seq = max_seq  # wpe rows and the causal-mask buffers
        self.seq = max_seq      # this step's sequence length (step())
        self.layers = layers
        self.d = d_model
        self.heads = heads
        self.amp = precision == "amp"
        self.eager = attention == "eager"
        self.param_bytes = FP32 if self.amp else HALF
        # AMP keeps the residual stream and layer norms in fp32.
        self.resid_bytes = FP32 if self.amp else HALF
        self.params = []  # (name, numel, ptr)
        self.optimizer_state = None
        self.master = []  # bf16: fp32 master copies
        self.mask_buffers = []

    # ---- setup ----

    def setup(self):
        d = self.d
        shapes = [("wte", VOCAB * d), ("wpe", self.max_seq * d)]
        for layer in range(self.layers):
            p = f"h.{layer}."
            shapes += [
                (p + "ln_1.weight", d), (p + "ln_1.bias", d),
                (p + "attn.c_attn.weight", d * 3 * d), (p + "attn.c_attn.bias", 3 * d),
                (p + "attn.c_proj.weight", d * d), (p + "attn.c_proj.bias", d),
                (p + "ln_2.weight", d), (p + "ln_2.bias", d),
                (p + "mlp.c_fc.weight", d * 4 * d), (p + "mlp.c_fc.bias", 4 * d),
                (p + "mlp.c_proj.weight", 4 * d * d), (p + "mlp.c_proj.bias", d),
            ]
        shapes += [("ln_f.weight", d), ("ln_f.bias", d)]
        for name, numel in shapes:  # model.to("cuda")
            self.params.append((name, numel, self.t.alloc(numel * self.param_bytes)))
        if self.eager:  # the causal-mask buffer each attention layer registers
            self.mask_buffers = [self.t.alloc(self.max_seq * self.max_seq * BOOL) for _ in range(self.layers)]
        if not self.amp:  # the optimizer's fp32 master weights
            self.master = [self.t.alloc(numel * FP32) for _, numel, _ in self.params]

    def param_numel(self, suffix, layer=None):
        name = suffix if layer is None else f"h.{layer}.{suffix}"
        for n, numel, _ in self.params:
            if n == name:
                return numel
        raise KeyError(name)

    # ---- one step ----

    def step(self, batch, seq=None):
        t = self.t
        self.seq = self.max_seq if seq is None else seq
        bs = batch * self.seq
        input_ids = t.alloc(bs * INT64)
        labels = t.alloc(bs * INT64)
        self.grads = {}
        self.autocast_cache = []  # bias casts, freed when autocast exits

        saved_layers, logits, loss_saved = self.forward(batch)
        for ptr in self.autocast_cache:
            t.free(ptr)
        self.backward(batch, saved_layers, loss_saved)
        self.optimizer_step()
        # zero_grad(set_to_none=True), then the step's outputs go out of scope.
        t.free_all(self.grads.values())
        t.free_all([logits, input_ids, labels])

    def cast_weight(self, numel, cache_only=False):
        """Autocast's fp16 copy of a weight (AMP only); None in bf16 mode."""
        if not self.amp:
            return None
        ptr = self.t.alloc(numel * HALF)
        if cache_only:
            self.autocast_cache.append(ptr)
        return ptr

    def forward(self, batch):
        t, d = self.t, self.d
        bs = batch * self.seq
        rb = self.resid_bytes
        position_ids = t.alloc(self.seq * INT64)
        tok = t.alloc(bs * d * rb)
        pos = t.alloc(self.seq * d * rb)
        h = t.alloc(bs * d * rb)
        t.free_all([tok, pos, position_ids])
        x = t.alloc(bs * d * rb)  # embedding dropout
        emb_mask = t.alloc(bs * d * BOOL)
        t.free(h)
        self.emb_mask = emb_mask

        saved_layers = []
        for layer in range(self.layers):
            saved, x = self.layer_forward(batch, layer, x)
            saved_layers.append(saved)

        # ln_f, lm_head (tied to wte), loss as in GPT2LMHeadModel.
        lnf = {"x": x, "mean": t.alloc(bs * FP32), "rstd": t.alloc(bs * FP32)}
        out = t.alloc(bs * d * rb)
        if self.amp:
            lnf["h16"] = t.alloc(bs * d * HALF)
            t.free(out)
            lnf["w16"] = t.alloc(VOCAB * d * HALF)
        else:
            lnf["h16"] = out
        logits = t.alloc(bs * VOCAB * HALF)
        rows = batch * (self.seq - 1)
        loss_saved = {}
        if self.amp:
            shift = t.alloc(rows * VOCAB * HALF)
            shift_labels = t.alloc(rows * INT64)
            cast = t.alloc(rows * VOCAB * FP32)  # cross_entropy autocasts to fp32
            t.free(shift)
            logp = t.alloc(rows * VOCAB * FP32)
            t.free(cast)
        else:
            # HF upcasts logits to fp32 before the loss; the fp32 copy is what
            # the model returns, so it lives to the end of the step.
            logits32 = t.alloc(bs * VOCAB * FP32)
            t.free(logits)
            logits = logits32
            shift = t.alloc(rows * VOCAB * FP32)
            shift_labels = t.alloc(rows * INT64)
            logp = t.alloc(rows * VOCAB * FP32)
            t.free(shift)
        loss = t.alloc(FP32)
        total_weight = t.alloc(FP32)
        loss_saved = {"lnf": lnf, "logp": logp, "shift_labels": shift_labels,
                      "loss": loss, "total_weight": total_weight}
        if self.amp:
            loss_saved["scaled"] = t.alloc(FP32)  # scaler.scale(loss)
        return saved_layers, logits, loss_saved

    def layer_forward(self, batch, layer, x_in):
        t, d, heads = self.t, self.d, self.heads
        bs = batch * self.seq
        rb = self.resid_bytes
        scores = batch * heads * self.seq * self.seq
        s = {"x_in": x_in}
        # ln_1 then c_attn (Conv1D: addmm).
        s["ln1_mean"], s["ln1_rstd"] = t.alloc(bs * FP32), t.alloc(bs * FP32)
        ln1 = t.alloc(bs * d * rb)
        if self.amp:
            s["x16"] = t.alloc(bs * d * HALF)
            t.free(ln1)
        else:
            s["x16"] = ln1
        s["w_attn"] = self.cast_weight(d * 3 * d)
        self.cast_weight(3 * d, cache_only=True)
        qkv = t.alloc(bs * 3 * d * HALF)
        if self.eager:
            # matmul(q, k^T) on head-split views copies q and k contiguous.
            s["q"], s["k"] = t.alloc(bs * d * HALF), t.alloc(bs * d * HALF)
            raw = t.alloc(scores * HALF)
            scaled = t.alloc(scores * HALF)  # / sqrt(head_dim)
            t.free(raw)
            masked = t.alloc(scores * HALF)  # where(causal_mask, w, min)
            t.free(scaled)
            if self.amp:  # softmax runs in fp32 under autocast, then .type(v.dtype)
                as32 = t.alloc(scores * FP32)
                t.free(masked)
                s["probs"] = t.alloc(scores * FP32)
                t.free(as32)
                probs16 = t.alloc(scores * HALF)
            else:
                s["probs"] = t.alloc(scores * HALF)
                t.free(masked)
                probs16 = None
            s["attn_drop"] = t.alloc(scores * HALF)
            s["attn_mask"] = t.alloc(scores * BOOL)
            if probs16 is not None:
                t.free(probs16)
            s["v"] = t.alloc(bs * d * HALF)
            ctx = t.alloc(bs * d * HALF)
            s["merged"] = t.alloc(bs * d * HALF)  # merge heads: permute + contiguous
            t.free(ctx)
        else:
            # Flash attention wants contiguous (batch, heads, seq, head_dim).
            s["q"], s["k"], s["v"] = (t.alloc(bs * d * HALF) for _ in range(3))
            s["ctx"] = t.alloc(bs * d * HALF)
            s["lse"] = t.alloc(batch * heads * self.seq * FP32)
            s["rng"] = t.alloc(16)
            s["merged"] = t.alloc(bs * d * HALF)
        t.free(qkv)  # q, k, v were views of it; the copies are what is saved
        # c_proj, dropout, residual.
        s["w_proj"] = self.cast_weight(d * d)
        self.cast_weight(d, cache_only=True)
        proj = t.alloc(bs * d * HALF)
        drop = t.alloc(bs * d * HALF)
        s["resid_mask"] = t.alloc(bs * d * BOOL)
        t.free(proj)
        x1 = t.alloc(bs * d * rb)
        t.free(drop)
        s["x1"] = x1
        # ln_2, MLP (c_fc, gelu, c_proj), dropout, residual.
        s["ln2_mean"], s["ln2_rstd"] = t.alloc(bs * FP32), t.alloc(bs * FP32)
        ln2 = t.alloc(bs * d * rb)
        if self.amp:
            s["h16"] = t.alloc(bs * d * HALF)
            t.free(ln2)
        else:
            s["h16"] = ln2
        s["w_fc"] = self.cast_weight(d * 4 * d)
        self.cast_weight(4 * d, cache_only=True)
        s["fc"] = t.alloc(bs * 4 * d * HALF)
        s["gelu"] = t.alloc(bs * 4 * d * HALF)
        s["w_fproj"] = self.cast_weight(4 * d * d)
        self.cast_weight(d, cache_only=True)
        fproj = t.alloc(bs * d * HALF)
        mdrop = t.alloc(bs * d * HALF)
        s["mlp_mask"] = t.alloc(bs * d * BOOL)
        t.free(fproj)
        x2 = t.alloc(bs * d * rb)
        t.free(mdrop)
        return s, x2

    def param_grad(self, name, through_autocast=True):
        """AccumulateGrad: the first gradient of a step allocates param.grad.

        Under AMP a linear layer's weight and bias reach it through their
        autocast fp16 copies, so their fp16 gradient is cast back to fp32 on
        the way; layer norms and embeddings run in fp32 and do not.
        """
        numel = self.param_numel(name)
        if self.amp and not through_autocast:
            g = self.t.alloc(numel * FP32)
        elif self.amp:
            g16 = self.t.alloc(numel * HALF)
            g = self.t.alloc(numel * FP32)
            self.t.free(g16)
        else:
            g = self.t.alloc(numel * HALF)
        if name in self.grads:  # accumulate in place (tied wte)
            self.t.free(g)
        else:
            self.grads[name] = g

    def backward(self, batch, saved_layers, loss_saved):
        t, d = self.t, self.d
        bs = batch * self.seq
        rb = self.resid_bytes
        rows = batch * (self.seq - 1)
        one = t.alloc(FP32)  # grad of the (scaled) loss
        if self.amp:
            g_loss = t.alloc(FP32)
            t.free_all([one, loss_saved["scaled"]])
            one = g_loss
        g_logp = t.alloc(rows * VOCAB * FP32)  # nll_loss backward
        t.free_all([one, loss_saved["loss"], loss_saved["total_weight"]])
        g_shift = t.alloc(rows * VOCAB * FP32)  # log_softmax backward
        t.free_all([g_logp, loss_saved["logp"], loss_saved["shift_labels"]])
        if self.amp:
            g16 = t.alloc(rows * VOCAB * HALF)
            t.free(g_shift)
            g_logits = t.alloc(bs * VOCAB * HALF)  # slice + contiguous backward
            t.free(g16)
        else:
            g32 = t.alloc(bs * VOCAB * FP32)
            t.free(g_shift)
            g_logits = t.alloc(bs * VOCAB * HALF)  # .float() backward
            t.free(g32)
        lnf = loss_saved["lnf"]
        g_h = t.alloc(bs * d * HALF)  # lm_head backward
        self.param_grad("wte")
        t.free_all([g_logits, lnf["h16"]] + ([lnf["w16"]] if self.amp else []))
        if self.amp:
            g_out = t.alloc(bs * d * FP32)
            t.free(g_h)
            g_h = g_out
        g_x = t.alloc(bs * d * rb)  # ln_f backward
        self.param_grad("ln_f.weight", through_autocast=False)
        self.param_grad("ln_f.bias", through_autocast=False)
        t.free_all([g_h, lnf["mean"], lnf["rstd"], lnf["x"]])

        for layer in reversed(range(self.layers)):
            g_x = self.layer_backward(batch, layer, saved_layers[layer], g_x)

        g_h = t.alloc(bs * d * rb)  # embedding dropout backward
        t.free_all([g_x, self.emb_mask])
        g_pos = t.alloc(self.seq * d * rb)  # sum over the batch for wpe
        sort_keys, sort_idx = t.alloc(bs * INT64), t.alloc(bs * INT64)
        dense = t.alloc(VOCAB * d * self.param_bytes)  # embedding_dense_backward
        t.free_all([sort_keys, sort_idx])
        t.free(dense)  # added in place into wte.grad (tied to lm_head)
        self.param_grad("wpe", through_autocast=False)
        t.free_all([g_pos, g_h])

    def layer_backward(self, batch, layer, s, g_x2):
        t, d, heads = self.t, self.d, self.heads
        bs = batch * self.seq
        rb = self.resid_bytes
        scores = batch * heads * self.seq * self.seq
        p = f"h.{layer}."

        def linear_backward(g_out, saved_input, saved_weight, in_features, weight, bias):
            g_in = t.alloc(bs * in_features * HALF)
            self.param_grad(p + weight)
            self.param_grad(p + bias)
            t.free_all([g_out, saved_input] + ([saved_weight] if saved_weight else []))
            return g_in

        # MLP branch.
        g_branch = t.alloc(bs * d * HALF) if self.amp else None  # fp32 -> fp16 grad
        g_fproj = t.alloc(bs * d * HALF)  # dropout backward
        t.free_all([s["mlp_mask"]] + ([g_branch] if g_branch else []))
        g_gelu = linear_backward(g_fproj, s["gelu"], s["w_fproj"], 4 * d,
                                 "mlp.c_proj.weight", "mlp.c_proj.bias")
        g_fc = t.alloc(bs * 4 * d * HALF)  # gelu backward
        t.free_all([g_gelu, s["fc"]])
        g_h16 = linear_backward(g_fc, s["h16"], s["w_fc"], d, "mlp.c_fc.weight", "mlp.c_fc.bias")
        if self.amp:
            g32 = t.alloc(bs * d * FP32)
            t.free(g_h16)
            g_h16 = g32
        g_part = t.alloc(bs * d * rb)  # ln_2 backward
        self.param_grad(p + "ln_2.weight", through_autocast=False)
        self.param_grad(p + "ln_2.bias", through_autocast=False)
        t.free_all([g_h16, s["ln2_mean"], s["ln2_rstd"], s["x1"]])
        g_x1 = t.alloc(bs * d * rb)  # residual: both paths summed
        t.free_all([g_x2, g_part])

        # Attention branch.
        g_branch = t.alloc(bs * d * HALF) if self.amp else None
        g_proj = t.alloc(bs * d * HALF)
        t.free_all([s["resid_mask"]] + ([g_branch] if g_branch else []))
        g_merged = linear_backward(g_proj, s["merged"], s["w_proj"], d,
                                   "attn.c_proj.weight", "attn.c_proj.bias")
        if self.eager:
            g_drop = t.alloc(scores * HALF)  # bmm(probs, v) backward
            g_v = t.alloc(bs * d * HALF)
            t.free_all([g_merged, s["attn_drop"], s["v"]])
            g_probs = t.alloc(scores * HALF)  # dropout backward
            t.free_all([g_drop, s["attn_mask"]])
            if self.amp:
                g32 = t.alloc(scores * FP32)  # .type(v.dtype) backward
                t.free(g_probs)
                g_sm = t.alloc(scores * FP32)  # softmax backward
                t.free_all([g32, s["probs"]])
                g_masked = t.alloc(scores * HALF)  # autocast's fp32 cast backward
                t.free(g_sm)
            else:
                g_masked = t.alloc(scores * HALF)
                t.free_all([g_probs, s["probs"]])
            g_scaled = t.alloc(scores * HALF)  # where backward
            t.free(g_masked)
            g_scores = t.alloc(scores * HALF)  # division backward
            t.free(g_scaled)
            g_q, g_k = t.alloc(bs * d * HALF), t.alloc(bs * d * HALF)
            t.free_all([g_scores, s["q"], s["k"]])
        else:
            delta = t.alloc(batch * heads * self.seq * FP32)  # flash backward workspace
            g_q, g_k, g_v = (t.alloc(bs * d * HALF) for _ in range(3))
            t.free_all([delta, g_merged, s["q"], s["k"], s["v"], s["ctx"], s["lse"], s["rng"]])
        g_qkv = t.alloc(bs * 3 * d * HALF)  # split backward: cat
        t.free_all([g_q, g_k, g_v])
        g_x16 = linear_backward(g_qkv, s["x16"], s["w_attn"], d,
                                "attn.c_attn.weight", "attn.c_attn.bias")
        if self.amp:
            g32 = t.alloc(bs * d * FP32)
            t.free(g_x16)
            g_x16 = g32
        g_part = t.alloc(bs * d * rb)  # ln_1 backward
        self.param_grad(p + "ln_1.weight", through_autocast=False)
        self.param_grad(p + "ln_1.bias", through_autocast=False)
        t.free_all([g_x16, s["ln1_mean"], s["ln1_rstd"], s["x_in"]])
        g_x = t.alloc(bs * d * rb)
        t.free_all([g_x1, g_part])
        return g_x

    def optimizer_step(self):
        t = self.t
        names = [name for name, _, _ in self.params]
        numels = [numel for _, numel, _ in self.params]
        small = []
        if self.amp:  # scaler.unscale_: found_inf, inv_scale
            small += [t.alloc(FP32), t.alloc(FP32)]
        # clip_grad_norm_(max_norm=1.0), foreach: per-tensor norms, stacked.
        norms = [t.alloc(FP32) for _ in names]
        stacked = t.alloc(len(names) * FP32)
        t.free_all(norms)
        total, coef = t.alloc(FP32), t.alloc(FP32)
        t.free_all([stacked, total, coef])
        if not self.amp:  # fp32 copies of the bf16 gradients for the master step
            master_grads = [t.alloc(n * FP32) for n in numels]
        if self.optimizer_state is None:  # first step: exp_avg, exp_avg_sq
            self.optimizer_state = [(t.alloc(n * FP32), t.alloc(n * FP32)) for n in numels]
        # _multi_tensor_adam: exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sqs), then
        # in-place div/add/addcdiv; the list is freed when the step returns.
        sqrt = [t.alloc(n * FP32) for n in numels]
        t.free_all(sqrt)
        if not self.amp:
            t.free_all(master_grads)
        if self.amp:  # scaler.update: growth tracker and new scale
            small += [t.alloc(FP32), t.alloc(FP32)]
        t.free_all(small)


def make_trace(name, layers, d_model, heads, precision, attention, batches, seqs=None):
    trace = Trace(name)
    max_seq = max(seqs) if seqs else SEQ
    run = Gpt2Run(trace, layers, d_model, heads, precision, attention, max_seq)
    run.setup()
    setup_live = dict(trace.live)
    for step, batch in enumerate(batches):
        run.step(batch, seqs[step] if seqs else None)
    # Everything a step allocated is gone at its end, except the optimizer state.
    state = {p for pair in run.optimizer_state for p in pair}
    leaked = set(trace.live) - set(setup_live) - state
    assert not leaked, f"{name}: {len(leaked)} tensors outlive their step"
    return trace


# (file name, layers, d_model, heads, precision, attention, batch size per step)
TRACES = [
    # GPT-2 small, AMP fp16 with eager attention; batch grows from 2 to 4.
    ("gpt2_small_amp_fp16", 12, 768, 12, "amp", "eager", [2, 2, 2, 4, 4]),
    # GPT-2 medium, bf16 with fp32 master weights and flash attention; batch
    # shrinks from 4 to 3 (e.g. fewer sequences fit after a length change).
    ("gpt2_medium_bf16", 24, 1024, 16, "bf16", "sdpa", [4, 4, 3, 3]),
]

# Long-context full steps: (file name, layers, d_model, heads, precision,
# attention, batch per step, sequence length per step). Eager attention at
# long, varying lengths: each layer's (batch, heads, seq, seq) score buffers
# are hundreds of MB and change size every step, as with packed or
# length-bucketed long documents.
LONG_CONTEXT_TRACES = [
    ("gpt2_longctx_amp_fp16", 12, 768, 12, "amp", "eager", [1, 1, 1, 1, 1],
     [3072, 4096, 2560, 3584, 4096]),
]


def record(time_ns, kind, detail=0, client=0, stream=0, address=0, size=0):
    """One 40-byte event record (docs/trace-format.md, "Event records")."""
    return struct.pack("<QHHIQQQ", time_ns, kind, detail, client, stream, address, size)


def encode_trace_file(metadata, records, end_time_ns, version):
    """A whole trace file: header, the given 40-byte records, end record."""
    entries = b"".join(
        struct.pack("<I", len(k)) + k + struct.pack("<I", len(v)) + v
        for k, v in ((k.encode(), v.encode()) for k, v in metadata))
    header_size = (40 + len(entries) + 7) // 8 * 8
    fixed = b"SPWTRACE" + struct.pack("<IIIIIIII", version, header_size, 40, len(entries),
                                      len(metadata), 0, 0, 0)
    header = bytearray((fixed + entries).ljust(header_size, b"\0"))
    struct.pack_into("<I", header, 32, zlib.crc32(bytes(header)))
    body = b"".join(records)
    assert len(body) == 40 * len(records)
    end = bytearray(record(end_time_ns, 0xFFFF, address=len(records)))
    crc = zlib.crc32(bytes(end[:32]), zlib.crc32(body))
    struct.pack_into("<Q", end, 32, crc)
    return bytes(header) + body + bytes(end)


def write_binary_trace(trace, path, metadata):
    """Writes `trace` (allocs and frees) as a spillway trace file, format version 1."""
    kinds = {"alloc": 1, "free": 2}
    records = []
    for line in trace.lines:
        action, ptr, size, stream, time_ns = line.split(",")
        records.append(record(int(time_ns), kinds[action], stream=int(stream),
                              address=int(ptr, 16), size=int(size)))
    data = encode_trace_file(metadata, records, trace.time_ns, 1)
    with open(path, "wb") as out:
        out.write(data)
    return len(data)


# Format version 3 kinds (docs/trace-format.md).
CHUNK_FETCH, CHUNK_DROP, STEP = 6, 8, 10
OP_NAME, OP_BEGIN, OP_END, CHUNK_ACCESS, CHUNK_RELEASE = 11, 12, 13, 14, 15
READ, READ_WRITE = 1, 2  # chunk_access detail


def op_name_records(time_ns, name_id, name):
    """The op_name records defining `name_id`: piece 0 with the length in
    bytes in `stream`, then the UTF-8 bytes 24 per record in the record's last
    24 bytes, zero-padded."""
    data = name.encode()
    records = [record(time_ns, OP_NAME, detail=0, client=name_id, stream=len(data))]
    for piece, at in enumerate(range(0, len(data), 24), start=1):
        records.append(struct.pack("<QHHI", time_ns, OP_NAME, piece, name_id) +
                       data[at:at + 24].ljust(24, b"\0"))
    return records


class V3Trace:
    """Builds a version-3 event stream: ops with interned names and sequence
    numbers, the chunk uses inside them, step boundaries."""

    def __init__(self):
        self.records = []
        self.time_ns = 0
        self.names = {}  # name -> id, from 1
        self.next_sequence = 1
        self.open = []  # (sequence, name id, begin time), innermost last

    def tick(self, ns=1000):
        self.time_ns += ns
        return self.time_ns

    def begin(self, name, thread=4242):
        t = self.tick()
        if name not in self.names:
            self.names[name] = len(self.names) + 1
            self.records += op_name_records(t, self.names[name], name)
        parent = self.open[-1][0] if self.open else 0
        sequence = self.next_sequence
        self.next_sequence += 1
        self.records.append(record(t, OP_BEGIN, client=self.names[name], stream=thread,
                                   address=sequence, size=parent))
        self.open.append((sequence, self.names[name], t, thread))

    def end(self):
        sequence, name_id, begun, thread = self.open.pop()
        t = self.tick()
        self.records.append(record(t, OP_END, client=name_id, stream=thread, address=sequence,
                                   size=t - begun))

    def use(self, client, chunk, tensor, capacity, written, fetch_bytes=0):
        if fetch_bytes:
            self.records.append(record(self.tick(), CHUNK_FETCH, client=client, stream=capacity,
                                       address=chunk, size=fetch_bytes))
        self.records.append(record(self.tick(), CHUNK_ACCESS,
                                   detail=READ_WRITE if written else READ, client=client,
                                   stream=capacity, address=chunk, size=tensor))

    def release(self, client, chunk, tensor, capacity):
        self.records.append(record(self.tick(), CHUNK_RELEASE, client=client, stream=capacity,
                                   address=chunk, size=tensor))

    def step(self, number):
        self.records.append(record(self.tick(), STEP, address=number))


# The op names of the sample, one longer than three records and one empty.
V3_SAMPLE_LONG_NAME = "aten::_scaled_dot_product_flash_attention_backward" + ".x" * 20
V3_SAMPLE_OPS_PER_STEP = 3


def write_v3_sample(path):
    """Two steps of a two-layer model: per step linear (nesting addmm) on
    chunk 0, the long-named op on chunk 1, an empty-named op; chunk 0 is
    fetched in the first step only."""
    trace = V3Trace()
    capacity = 64 << 20
    for step in (1, 2):
        trace.begin("aten::linear")
        trace.use(1, 0, 10, capacity, False, fetch_bytes=4096 if step == 1 else 0)
        trace.begin("aten::addmm")
        trace.use(1, 0, 10, capacity, False)
        trace.release(1, 0, 10, capacity)
        trace.end()
        trace.release(1, 0, 10, capacity)
        trace.end()
        trace.begin(V3_SAMPLE_LONG_NAME)
        trace.use(1, 1, 11, capacity, True, fetch_bytes=8192 if step == 1 else 0)
        trace.release(1, 1, 11, capacity)
        trace.end()
        trace.begin("")
        trace.end()
        trace.step(step)
    data = encode_trace_file([("writer", "tools/tracegen/make_traces.py")], trace.records,
                             trace.tick(), 3)
    with open(path, "wb") as out:
        out.write(data)
    return len(data)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_out = os.path.normpath(os.path.join(here, "..", "..", "tests", "data"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=default_out, help="output folder (default: tests/data)")
    parser.add_argument("--v3-sample", metavar="FILE",
                        help="write only a small version-3 trace to FILE")
    args = parser.parse_args()
    if args.v3_sample:
        write_v3_sample(args.v3_sample)
        return
    os.makedirs(args.out, exist_ok=True)
    runs = [run + (None,) for run in TRACES] + LONG_CONTEXT_TRACES
    for name, layers, d_model, heads, precision, attention, batches, seqs in runs:
        trace = make_trace(name, layers, d_model, heads, precision, attention, batches, seqs)
        path = os.path.join(args.out, name + ".csv")
        trace.write(path)
        allocs = sum(1 for line in trace.lines if line.startswith("alloc"))
        print(f"{path}: {len(trace.lines)} events ({allocs} allocs), "
              f"peak live {trace.peak_live_bytes / 2**30:.2f} GiB, "
              f"{os.path.getsize(path) / 2**20:.2f} MiB", file=sys.stderr)

    # A small binary trace (2-layer GPT-2 small, one step at batch 1) for the
    # trace-file and replay tests, a copy cut inside a record, and a CSV with
    # a bad line.
    tiny = make_trace("tiny", 2, 768, 12, "amp", "eager", [1])
    tiny_path = os.path.join(args.out, "tiny_v1.trace")
    size = write_binary_trace(tiny, tiny_path, [
        ("writer", "tools/tracegen/make_traces.py"),
        ("model", "gpt2-small shapes, 2 layers, amp fp16, eager attention, batch 1, 1 step"),
    ])
    with open(tiny_path, "rb") as whole, open(os.path.join(args.out, "truncated_v1.trace"),
                                               "wb") as cut:
        cut.write(whole.read()[:size - 40 - 17])  # inside the last event record
    with open(os.path.join(args.out, "bad_line.csv"), "w", newline="\n") as bad:
        bad.write("action,ptr,size,stream,time_ns\n"
                  "alloc,0x1000,4096,0,1\n"
                  "alloc,0x2000,8192,0,2\n"
                  "free,0x1000,4096,0,3\n"
                  "alloc,0x3000,many,0,4\n")
    print(f"{tiny_path}: {len(tiny.lines)} events, {size} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
