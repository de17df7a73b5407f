#!/usr/bin/python3
"""The MTP drafter (drafter_kind mtp) and the feature stream end to end:
tandem-gateway, tandem-verifier and tandem-drafter as real processes on
loopback with a tiny random checkpoint that carries an MTP head (written by
bench_make_model --shape tiny --layout release, the layout Qwen3.5/3.6
releases ship, into the test's temporary folder), driven by Python grpcio.

Cases:
  greedy     speculation with the MTP drafter gives exactly the plain greedy
             tokens (hidden states streamed as f32 in messages cut small
             enough that a prompt takes several FeatureChunks, then as bf16,
             there over 50 more prompts);
             blocks are proposed and verified (speculative rounds > 0 in the
             verifier's counters); the drafter's blocks equal the drafts of
             `tandem logits --mtp-out --mtp-draft`, which runs the head on
             the CPU from the full model, an independent path to the hidden
             states; sampled requests complete with speculative rounds
  sampling   sampled requests drafted by the head follow the target's
             distribution (chi-square against `tandem logits`), the blocks
             carrying the head's distributions; seeded requests alone give
             the tokens they gave in a batch
  refusals   an MTP drafter against a verifier of another model
             (drafter-target-model) and against a verifier that streams no
             hidden states (drafter-features), named in `tandem status`, in
             a request that requires speculation and in `tandem check-config`
  restart    a drafter killed and restarted on its address: the verifier
             re-opens the running sequence there with every position's states
             (drafter_reopen_tries); drafts from them, output the plain one
  malformed  malformed feature messages end speculation for their sequence
             only: a SequenceError naming the field, the other sequences of
             the stream go on drafting
  no_head    a drafter whose model has no mtp.* tensors refuses to start,
             naming the model and the missing tensor; the configuration
             checks of drafter_kind mtp
  vocab      a draft vocabulary (draft_vocab), on the MTP head and on a model
             drafter: outputs unchanged, drafts only from the listed tokens,
             each block's first draft the best listed token of the head's row
             by `tandem logits --mtp-out` (of the model's row by `tandem
             logits`); an n-gram drafter and malformed lists refused, naming
             the file, the line and the token
  fp8        weights fp8 on the MTP head: outputs unchanged, the drafts those
             of a checkpoint whose head and LM head numpy rounded to FP8
  shm        the colocated feature stream (feature_transport): greedy
             outputs with shm equal those with grpc and plain decoding over
             many prompts, the rows really going by shared memory (counters,
             logs, tandem status); a ring too small for long prompts sends
             those rows inline with the same outputs; shm set where it
             cannot work (a drafter with its own /dev/shm, as on another
             host; a ring /dev/shm cannot hold; a drafter set to grpc) is an
             error naming the setting, never a quiet fallback, while auto
             falls back to grpc; no segment is left in /dev/shm after the
             handshake, after the services exit, or after kill -9 of the
             drafter

usage: mtp_test.py CASE --cli PATH --gateway PATH --verifier PATH --drafter PATH
                   --make-model PATH --source ROOT
"""
import argparse
import concurrent.futures
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "services"))
sys.path.insert(0, HERE)
import services_test as st  # noqa: E402  (process and client helpers)

check = st.check
BLOCK = 4


def make_model(name, *extra):
    d = os.path.join(st.TMP, name)
    if not os.path.isdir(d):
        r = subprocess.run([st.ARGS.make_model, "--shape", "tiny", "--out", d] + list(extra),
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise SystemExit("FAIL: bench_make_model: %s%s" % (r.stdout, r.stderr))
    return d


def mtp_model():
    return make_model("mtp-release", "--layout", "release")


def set_tensor(model, name, value):
    """Sets every element of a bf16 tensor of the checkpoint to `value`."""
    import struct
    for f in sorted(os.listdir(model)):
        if not f.endswith(".safetensors"):
            continue
        path = os.path.join(model, f)
        with open(path, "r+b") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
            if name not in header:
                continue
            t = header[name]
            assert t["dtype"] == "BF16", t
            a, b = t["data_offsets"]
            bits = struct.unpack("<I", struct.pack("<f", value))[0] >> 16
            fh.seek(8 + n + a)
            fh.write(struct.pack("<H", bits) * ((b - a) // 2))
            return
    raise SystemExit("FAIL: no tensor %s in %s" % (name, model))


def rename_tensor(model, name, new):
    """Renames a tensor (same length: the offsets stay) in its shard's header
    and in the index."""
    import struct
    assert len(name) == len(new)
    for f in sorted(os.listdir(model)):
        path = os.path.join(model, f)
        if f.endswith(".safetensors"):
            with open(path, "r+b") as fh:
                n = struct.unpack("<Q", fh.read(8))[0]
                header = fh.read(n)
                key = b'"' + name.encode() + b'"'
                if key in header:
                    fh.seek(8)
                    fh.write(header.replace(key, b'"' + new.encode() + b'"'))
        elif f.endswith(".index.json"):
            with open(path) as fh:
                index = json.load(fh)
            index["weight_map"][new] = index["weight_map"].pop(name)
            with open(path, "w") as fh:
                json.dump(index, fh)


def agreeing_model():
    """A checkpoint whose target and MTP head agree on every token: their
    final norms' weights are -1, so (1 + w) zeroes both outputs, every logit
    is 0 and both take token 0 (the lowest id of a tie). Every draft is
    accepted: verdicts carry the states of whole blocks."""
    d = os.path.join(st.TMP, "mtp-agree")
    if not os.path.isdir(d):
        make_model("mtp-agree", "--layout", "release")
        set_tensor(d, "model.language_model.norm.weight", -1.0)
        set_tensor(d, "mtp.norm.weight", -1.0)
    return d


def prompts(n, seed=7):
    """n random prompts of distinct lengths (a sequence's first block, at
    position length + 1, tells which prompt it is)."""
    rnd = random.Random(seed)
    return [[rnd.randrange(320) for _ in range(n_)] for n_ in rnd.sample(range(5, 120), n)]


def generate(gw, ids, max_tokens=20, mode="SPECULATION_MODE_ON", sampling=None, fixed=True):
    spec = mode != "SPECULATION_MODE_OFF"
    req = {"token_ids": {"ids": ids}, "max_tokens": max_tokens, "ignore_eos": True,
           "speculation": {"mode": mode, "block_size": BLOCK if spec else 0,
                           "fixed_block_size": spec and fixed}}
    if sampling:
        req["sampling"] = sampling
    code, details, out, _, done = st.generate(gw, req)
    return code, details, out, done


def stack(model, dtype, verifier_args=(), drafter_args=(), own_shm=False, kind="mtp"):
    """Gateway, verifier v1 and MTP drafter d-mtp (kind "model": the model
    drafting for itself, still named d-mtp); own_shm: the drafter in a mount
    namespace with its own /dev/shm (as on another host)."""
    gw = st.gateway()
    v = st.replica("verifier", gw, "--model", model, "--replica-id", "v1", "--max-draft-tokens",
                   "8", *verifier_args)
    dargs = ["--model", model, "--drafter-kind", kind, "--replica-id", "d-mtp",
             "--draft-block-size", str(BLOCK), "--log-level", "debug"] + list(drafter_args)
    if kind == "mtp":
        dargs += ["--feature-dtype", dtype]
    if own_shm:
        d = st.drafter_apart(gw, *dargs)
    else:
        d = st.replica("drafter", gw, *dargs)
    s = st.wait_status(gw, lambda s: st.pair(s, "v1", "d-mtp") is not None, "pair v1+d-mtp")
    p = st.pair(s, "v1", "d-mtp")
    check(p and p["compatible"], "v1 + d-mtp compatible: %s" % json.dumps(p))
    return gw, v, d, s


STOPPED = []  # processes stopped, for their logs on failure


def stop_all():
    for p in reversed(st.PROCS):
        if p.p.poll() is None:
            check(p.stop() == 0, "%s exits 0 on SIGTERM" % p.name)
    STOPPED.extend(st.PROCS)
    st.PROCS.clear()


def mtp_reference(model, ids, k, nxt=None):
    """The drafts of the checkpoint's head after `ids` and then `nxt` (None:
    the target's greedy token there), from `tandem logits`."""
    out = os.path.join(st.TMP, "mtp-ref.npy")
    rc, so, se = st.run([st.ARGS.cli, "logits", "--model", model, "--ids",
                         ",".join(map(str, ids)), "--mtp-out", out, "--mtp-draft", str(k)] +
                        (["--mtp-next", str(nxt)] if nxt is not None else []))
    m = re.search(r"^mtp drafts:((?: \d+)+)$", so, re.M)
    if not check(rc == 0 and m, "tandem logits --mtp-draft: rc %d %s%s" % (rc, so, se)):
        return None
    return [int(x) for x in m.group(1).split()]


def blocks_of(drafter, seq_id=None):
    """(sequence, round, position, drafts) of every block the drafter logged."""
    got = []
    for m in re.finditer(r"sequence (\d+) round (\d+): block at position (\d+):((?: \d+)*)",
                         drafter.text()):
        got.append((int(m.group(1)), int(m.group(2)), int(m.group(3)),
                    [int(x) for x in m.group(4).split()]))
    return [b for b in got if seq_id is None or b[0] == seq_id]


# ---- cases ---------------------------------------------------------------------

def case_greedy():
    model = mtp_model()
    ps = prompts(4 if st.ARGS.quick else 8)
    # f32 features in messages of at most 8 KiB of rows (32 rows of 64 values):
    # the longer prompts go out as several FeatureChunks before their open.
    # The last stack's verifier splits the model over 2 ranks (tensor_parallel):
    # the hidden states it streams are rank 0's, whole rows like the rest.
    first_plain = None
    for dtype, vargs in (("f32", ("--max-message-size", "16KiB")), ("bf16", ()),
                         ("bf16", ("--tensor-parallel", "2"))):
        gw, v, d, s = stack(model, dtype, vargs)
        byid = {r["descriptor"]["replica_id"]: r["descriptor"] for r in s["replicas"]}
        dd, vd = byid.get("d-mtp", {}), byid.get("v1", {})
        check(dd.get("drafter_kind") == "DRAFTER_KIND_MTP", "drafter kind: %s" % dd)
        need = dd.get("features_needed", {})
        final_normed = [{"final_layer": True, "normed": True, "layer": 0}]
        check(need.get("specs") == final_normed and
              need.get("dtype", "FEATURE_DTYPE_UNSPECIFIED") ==
              ("FEATURE_DTYPE_F32" if dtype == "f32" else "FEATURE_DTYPE_BF16"),
              "drafter's features_needed: %s" % need)
        check(vd.get("features_available") == final_normed,
              "verifier's features_available: %s" % vd.get("features_available"))
        check(dd.get("target_model_fingerprint") == vd.get("model_fingerprint") and
              vd.get("model_fingerprint"), "drafter's target model is the verifier's")
        # Plain and speculative requests at once: batches mix sequences whose
        # drafter takes hidden states with sequences that take none.
        jobs = [(p, "SPECULATION_MODE_OFF") for p in ps] + [(p, "SPECULATION_MODE_ON") for p in ps]
        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as ex:
            res = list(ex.map(lambda j: generate(gw, j[0], mode=j[1]), jobs))
        plain, spec = res[:len(ps)], res[len(ps):]
        if first_plain is None:
            first_plain = [a[2] for a in plain]
        check([a[2] for a in plain] == first_plain,
              "%s %s: plain ids differ from the first verifier's" % (dtype, " ".join(vargs)))
        rounds = 0
        for i, (a, b) in enumerate(zip(plain, spec)):
            if not check(a[0] == "OK" and b[0] == "OK" and a[3] and b[3],
                         "%s prompt %d: %s %s / %s %s" % (dtype, i, a[0], a[1], b[0], b[1])):
                continue
            check(b[2] == a[2], "%s prompt %d: speculative ids %s != plain ids %s" %
                  (dtype, i, b[2], a[2]))
            check(b[3]["stats"]["speculation"].startswith("on"),
                  "%s prompt %d: speculation %s" % (dtype, i, b[3]["stats"]["speculation"]))
            rounds += int(b[3]["stats"].get("speculative_rounds", 0))
        c = st.counters(v.addr(), "/tandem.v1.Verifier/Describe")
        print("%s: %d speculative rounds, verifier counters: speculative_rounds %s, "
              "drafted %s, accepted %s" % (dtype, rounds, c.get("speculative_rounds"),
                                           c.get("drafted_tokens"), c.get("accepted_tokens")),
              flush=True)
        check(rounds > 0 and c.get("speculative_rounds", 0) > 0 and
              c.get("drafted_tokens", 0) >= BLOCK, "blocks were proposed and verified: %s" % c)
        check(c.get("drafter_failures", 0) == 0 and c.get("malformed_blocks", 0) == 0,
              "no drafter failure: %s" % c)
        # Every committed position's state went out once: the prompts' but
        # their last token's at the opens, then one row per committed token.
        width = 64 * (4 if dtype == "f32" else 2)
        check(c.get("feature_rows_sent", 0) >= sum(len(p) - 1 for p in ps) and
              c.get("feature_bytes_sent", 0) == c.get("feature_rows_sent", 0) * width,
              "feature rows and bytes counted: %s" % c)
        check("SequenceError" not in d.text() and "WARN  drafter: sequence" not in d.text(),
              "the drafter answered no sequence with an error:\n" + d.text()[-3000:])
        # The adaptive rule: a random head's drafts are rejected, so it
        # pauses speculation, then probes; the rows of the paused positions
        # wait on the verifier and go with the reopen, which continues the
        # head's cache. (A seed keeps the rule's own cost priors, so the
        # pauses are short enough to probe within the request.)
        before = c
        seeded = {"temperature": 0, "seed": "3"}
        long_plain = [generate(gw, p, max_tokens=120, mode="SPECULATION_MODE_OFF")
                      for p in ps[:2]]
        long_spec = [generate(gw, p, max_tokens=120, fixed=False, sampling=seeded)
                     for p in ps[:2]]
        c = st.counters(v.addr(), "/tandem.v1.Verifier/Describe")
        for i, (a, b) in enumerate(zip(long_plain, long_spec)):
            check(a[0] == "OK" and b[0] == "OK" and a[2] == b[2] and len(a[2]) == 120,
                  "%s adaptive prompt %d: speculative %s, plain %s" % (dtype, i, b[2], a[2]))
            print("%s adaptive prompt %d: %s" % (dtype, i, b[3]["stats"]["speculation"]
                                                 if b[3] else None), flush=True)
        probes = sum(int(re.search(r"\((\d+) probe", b[3]["stats"]["speculation"]).group(1))
                     for b in long_spec if b[3] and "probe" in b[3]["stats"]["speculation"])
        check(c.get("adaptive_switch_offs", 0) > before.get("adaptive_switch_offs", 0) and
              probes > 0, "the adaptive rule paused speculation and probed again (%d probes): "
              "%s" % (probes, c))
        check(c.get("drafter_failures", 0) == 0 and "WARN  drafter: sequence" not in d.text(),
              "reopens after pauses continue the head's cache:\n" + d.text()[-3000:])
        if dtype == "f32":
            # The hidden states the verifier streamed are its model's: each
            # request's first blocks are what the head drafts from the same
            # tokens run through the full model on the CPU.
            blocks = blocks_of(d)
            first = {}
            for b in blocks:
                first.setdefault(b[0], b[2])
            # a request's first step verifies its first block: at the prompt's end
            by_len = {len(p): i for i, p in enumerate(ps)}
            # Each prompt's greedy continuation, as far as it was generated.
            outs = [p + (long_plain[i][2] if i < len(long_plain) else spec[i][2])
                    for i, p in enumerate(ps)]
            checked = reopened = 0
            for sid, pos0 in sorted(first.items()):
                i = by_len.get(pos0)
                if not check(i is not None, "sequence %d's first block at position %d is no "
                             "prompt's" % (sid, pos0)):
                    continue
                mine = [b for b in blocks if b[0] == sid]
                # Every block of the adaptive (paused and reopened) sequences,
                # the first three of the others.
                for (_, rnd, pos, drafts) in mine if i < len(long_plain) else mine[:3]:
                    # The block continues from `pos` tokens: the head holds
                    # the states of the first pos - 1, and the newest (the
                    # prompt's last, or the target's greedy choice) is the
                    # last next token. Greedy drafts are a chain: k drafts
                    # are the first k of BLOCK.
                    want = mtp_reference(model, outs[i][:pos - 1], BLOCK, outs[i][pos - 1])
                    check(want is not None and drafts == want[:len(drafts)],
                          "prompt %d round %d block at position %d: drafter %s, tandem logits "
                          "%s" % (i, rnd, pos, drafts, want))
                    checked += 1
                    reopened += pos > mine[0][2] + 40
            check(checked >= 2 * len(ps) and reopened > 0,
                  "blocks found in the drafter's log: %d (%d after a pause)" % (checked, reopened))
        else:
            # Fifty prompts (twenty in the sanitizer builds), eight at a time:
            # the speculative tokens are the plain ones.
            many = prompts(20 if st.ARGS.quick else 50, seed=11)
            with concurrent.futures.ThreadPoolExecutor(max_workers=8) as ex:
                pl = list(ex.map(lambda p: generate(gw, p, mode="SPECULATION_MODE_OFF"), many))
                sp = list(ex.map(lambda p: generate(gw, p), many))
            same = sum(1 for a, b in zip(pl, sp)
                       if a[0] == "OK" and b[0] == "OK" and a[2] == b[2] and len(a[2]) == 20)
            check(same == len(many), "%d prompts: %d speculative outputs equal the plain ones" %
                  (len(many), same))
            # Sampled requests (their drafts drawn: the sampling case).
            samp = {"temperature": 0.8, "top_p": 0.95, "seed": "5"}
            r1 = generate(gw, ps[0], sampling=samp)
            r2 = generate(gw, ps[0], sampling=samp)
            check(r1[0] == "OK" and r1[3] and int(r1[3]["stats"]["speculative_rounds"]) > 0,
                  "sampled request with the MTP drafter: %s %s %s" % (r1[0], r1[1], r1[3]))
            check(r1[2] == r2[2], "same seed, same tokens: %s / %s" % (r1[2], r2[2]))
        stop_all()
    # Whole blocks accepted: a verdict carries the states of the token the
    # verifier ran and of every draft (block + 1 rows), several messages' worth
    # for long prompts.
    gw, v, d, s = stack(agreeing_model(), "f32", ("--max-message-size", "16KiB"))
    plain = [generate(gw, p, mode="SPECULATION_MODE_OFF") for p in ps[:3]]
    spec = [generate(gw, p) for p in ps[:3]]
    for i, (a, b) in enumerate(zip(plain, spec)):
        check(a[0] == "OK" and b[0] == "OK" and b[2] == a[2] and a[2] == [0] * 20,
              "agreeing model, prompt %d: speculative %s, plain %s" % (i, b[2], a[2]))
    c = st.counters(v.addr(), "/tandem.v1.Verifier/Describe")
    print("agreeing model: verifier counters: speculative_rounds %s, drafted %s, accepted %s" %
          (c.get("speculative_rounds"), c.get("drafted_tokens"), c.get("accepted_tokens")),
          flush=True)
    check(c.get("accepted_tokens", 0) > 0 and
          c.get("accepted_tokens", 0) == c.get("drafted_tokens", -1),
          "every draft accepted: %s" % c)
    check(c.get("drafter_failures", 0) == 0 and "WARN  drafter: sequence" not in d.text(),
          "no sequence error:\n" + d.text()[-3000:])
    stop_all()


def case_sampling():
    """Sampled requests drafted by the MTP head follow the target's
    distribution (chi-square over the first three tokens under top-k 3,
    against `tandem logits`), the drafter's blocks carrying the head's own
    distributions (supports of up to 3 tokens, not one-hot); seeded requests
    sent again one by one give the tokens they gave in a batch."""
    import numpy as np  # Debian's python3-numpy
    model = mtp_model()
    gw, v, d, s = stack(model, "bf16")
    prompt = prompts(1, seed=5)[0]
    K = 3

    def top(ids):
        out = os.path.join(st.TMP, "l.npy")
        rc, so, se = st.run([st.ARGS.cli, "logits", "--model", model, "--ids",
                             ",".join(map(str, ids)), "--out", out])
        if rc != 0:
            raise SystemExit("FAIL: tandem logits: %s" % se)
        return st.softmax_topk(np.load(out)[-1].astype(float).tolist(), K)

    expect = {}
    for a, pa in top(prompt).items():
        for b, pb in top(prompt + [a]).items():
            for c, pc in top(prompt + [a, b]).items():
                expect[(a, b, c)] = pa * pb * pc
    N = 600 if st.ARGS.quick else 1500
    sampling = lambda i: {"temperature": 1.0, "top_k": K, "seed": str(500 + i)}  # noqa: E731
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as ex:
        res = list(ex.map(lambda i: generate(gw, prompt, max_tokens=3, sampling=sampling(i)),
                          range(N)))
    counts, rounds = {}, 0
    for r in res:
        if check(r[0] == "OK" and len(r[2]) == 3, "sampled request: %s %s %s" % r[:3]):
            counts[tuple(r[2])] = counts.get(tuple(r[2]), 0) + 1
            rounds += int(r[3]["stats"].get("speculative_rounds", 0))
    check(rounds >= N // 2, "too few speculative rounds (%d) for %d requests" % (rounds, N))
    outside = sum(n for k, n in counts.items() if k not in expect)
    check(outside == 0, "%d samples outside the target's top-%d support" % (outside, K))
    chi, df, crit = st.chi_square(expect, counts, N)
    supports = [int(x) for m in re.finditer(r"supports of its distributions:((?: \d+)+)", d.text())
                for x in m.group(1).split()]
    print("sampling: %d samples, chi2 %.1f, df %d, critical(0.001) %.1f; %d drafts "
          "sent with distributions, supports %d..%d" % (N, chi, df, crit, len(supports),
                                                         min(supports or [0]),
                                                         max(supports or [0])), flush=True)
    check(chi < crit, "sampled sequences do not follow the target distribution: chi2 %.1f >= "
          "%.1f" % (chi, crit))
    check(len(supports) >= rounds and max(supports or [0]) > 1 and max(supports) <= K,
          "the drafter's sampled blocks: %d drafts with distributions in %d rounds, supports "
          "%s" % (len(supports), rounds, sorted(set(supports))))
    again = [generate(gw, prompt, max_tokens=3, sampling=sampling(i)) for i in range(24)]
    differ = [i for i in range(24) if again[i][0] != "OK" or again[i][2] != res[i][2]]
    check(not differ, "seeded requests alone gave other tokens than in a batch: %s" %
          ["%d: %s / %s" % (i, res[i][2], again[i][2]) for i in differ[:5]])
    stop_all()


def case_refusals():
    model = mtp_model()
    other = st.model("other-target", "f32_gqa", None)  # another model, no tokenizer either
    gw = st.gateway("--replica-ttl", "60s")
    v = st.replica("verifier", gw, "--model", other, "--replica-id", "v-other")
    d = st.replica("drafter", gw, "--model", model, "--drafter-kind", "mtp", "--replica-id",
                   "d-mtp")
    s = st.wait_status(gw, lambda s: st.pair(s, "v-other", "d-mtp") is not None, "pair listed")
    p = st.pair(s, "v-other", "d-mtp")
    rules = [r["rule"] for r in p["refusals"]] if p else []
    check(p and not p["compatible"] and rules == ["drafter-target-model"],
          "v-other + d-mtp refused by drafter-target-model only: %s" % json.dumps(p))
    ref = st.reference()
    fp_other, fp_mtp = ref.model_fp(other), ref.model_fp(model)
    if p and p["refusals"]:
        r = p["refusals"][0]
        msg = r["message"]
        check(msg.startswith("rule drafter-target-model:") and
              "v-other (%s)" % v.addr() in msg and "d-mtp (%s)" % d.addr() in msg and
              fp_other[:12] in msg and fp_mtp[:12] in msg,
              "the refusal names the rule, both services and both fingerprints: " + msg)
        check(r["a_value"] == fp_other and r["b_value"] == fp_mtp, "both values: %s" % r)
    # A request that requires speculation fails naming the rule.
    code, details, _, _ = generate(gw, [1, 2, 3], max_tokens=4)
    check(code == "FAILED_PRECONDITION" and "drafter-target-model" in details,
          "spec required: %s %s" % (code, details))
    code, details, out, _ = generate(gw, [1, 2, 3], max_tokens=4,
                                     mode="SPECULATION_MODE_AUTO")
    check(code == "OK" and len(out) == 4, "plain service otherwise: %s %s" % (code, details))
    # A verifier of the drafter's model that streams no hidden states (an
    # older build), registered from Python.
    fake = {"role": "ROLE_VERIFIER", "replica_id": "v-old", "address": "10.9.9.9:1",
            "protocol": {"major": 1}, "snapshot_layout_version": 1,
            "state_strategy": "STATE_STRATEGY_EXTRA_BUFFER", "instance_id": "fake-v-old",
            "max_draft_tokens": 8, "model_fingerprint": fp_mtp}
    code, details, _ = st.unary(gw.addr(), "/tandem.v1.Registry/RegisterReplica",
                                {"descriptor": fake})
    check(code == "OK", "fake registration: %s %s" % (code, details))
    s = st.wait_status(gw, lambda s: st.pair(s, "v-old", "d-mtp") is not None, "v-old listed")
    p = st.pair(s, "v-old", "d-mtp")
    rules = [r["rule"] for r in p["refusals"]] if p else []
    check(p and rules == ["drafter-features"], "v-old + d-mtp refused by drafter-features only: "
          "%s" % json.dumps(p))
    if p and p["refusals"]:
        msg = p["refusals"][0]["message"]
        check("final layer after the norm" in msg and "no hidden states" in msg and
              "v-old (10.9.9.9:1)" in msg and "d-mtp (" in msg,
              "drafter-features names what is needed and what is streamed: " + msg)
    rc, out, err = st.run([st.ARGS.cli, "status", "--gateway", gw.addr()])
    check(rc == 0 and "rule drafter-target-model:" in out and "rule drafter-features:" in out,
          "tandem status prints both refusals:\n" + out + err)
    check("streams hidden states: final layer after the norm" in out and
          ("needs hidden states: final layer after the norm (bf16), of target model %s" %
           fp_mtp[:12]) in out, "tandem status shows the feature stream's sides:\n" + out)
    # Offline, on the configuration files.
    vf = st.write("v.yaml", "model: %s\n" % other)
    vok = st.write("v-ok.yaml", "model: %s\n" % model)
    df = st.write("d.yaml", "model: %s\ndrafter_kind: mtp\nfeature_dtype: f32\n" % model)
    rc, out, err = st.run([st.ARGS.cli, "check-config", "--verifier", vf, "--drafter", df])
    check(rc != 0 and "rule drafter-target-model" in out, "check-config refuses:\n" + out + err)
    rc, out, err = st.run([st.ARGS.cli, "check-config", "--verifier", vok, "--drafter", df])
    check(rc == 0 and "compatible" in out, "check-config passes the same model:\n" + out + err)
    rc, out, err = st.run([st.ARGS.drafter, "--check-config", "--config", df])
    check(rc == 0 and re.search(r"^feature_dtype: +f32 +# file:", out, re.M) and
          re.search(r"^drafter_kind: +mtp +# file:", out, re.M),
          "--check-config shows the keys:\n" + out + err)


def case_no_head():
    plain = st.model("no-head", "f32_gqa", None)
    rc, out, err = st.run([st.ARGS.drafter, "--drafter-kind", "mtp", "--model", plain,
                           "--listen", "127.0.0.1:0", "--health-listen", "127.0.0.1:0",
                           "--gateway", "127.0.0.1:1"])
    check(rc == 2 and "no tensor mtp.fc.weight" in err and ("model=%s" % plain) in err and
          "drafter_kind=mtp (flag:--drafter-kind)" in err,
          "a model without an MTP head: rc %d\n%s" % (rc, err))
    check("listening" not in err, "did not serve:\n" + err)
    # An incomplete head passes the configuration's look at its first tensor;
    # loading it names the missing one.
    part = os.path.join(st.TMP, "mtp-incomplete")
    shutil.copytree(mtp_model(), part)
    rename_tensor(part, "mtp.norm.weight", "xtp.norm.weight")
    rc, out, err = st.run([st.ARGS.drafter, "--drafter-kind", "mtp", "--model", part,
                           "--listen", "127.0.0.1:0", "--health-listen", "127.0.0.1:0",
                           "--gateway", "127.0.0.1:1"])
    check(rc != 0 and "mtp.norm.weight" in err and part in err and "drafter_kind mtp" in err,
          "an incomplete MTP head: rc %d\n%s" % (rc, err))
    rc, out, err = st.run([st.ARGS.drafter, "--check-config", "--drafter-kind", "mtp", "--model",
                           plain])
    check(rc != 0 and "no tensor mtp.fc.weight" in out and ("model=%s" % plain) in out and
          "mtp-drafter-needs-head" in out, "--check-config finds no head:\n" + out)
    d = st.write("d-nohead.yaml", "model: %s\ndrafter_kind: mtp\n" % plain)
    v = st.write("v-nohead.yaml", "model: %s\n" % plain)
    rc, out, err = st.run([st.ARGS.cli, "check-config", "--verifier", v, "--drafter", d])
    check(rc != 0 and "no tensor mtp.fc.weight" in out + err,
          "tandem check-config finds no head:\n" + out + err)
    rc, out, err = st.run([st.ARGS.drafter, "--check-config", "--drafter-kind", "mtp"])
    check(rc != 0 and "drafter_kind=mtp (flag:--drafter-kind)" in out and
          "MTP head" in out and "model='' (default)" in out, "mtp without a model:\n" + out)
    rc, out, err = st.run([st.ARGS.drafter, "--check-config", "--drafter-kind", "mtp", "--model",
                           mtp_model(), "--run-ahead", "on"])
    check(rc != 0 and "run_ahead=on (flag:--run-ahead)" in out and
          "drafter_kind=mtp (flag:--drafter-kind)" in out, "mtp with run_ahead on:\n" + out)
    rc, out, err = st.run([st.ARGS.drafter, "--check-config", "--drafter-kind", "mtp", "--model",
                           mtp_model()])
    check(rc == 0 and re.search(r"^run_ahead: +off +# auto", out, re.M) and
          re.search(r"^feature_dtype: +bf16 +# default$", out, re.M),
          "mtp drafter's effective configuration:\n" + out)
    rc, out, err = st.run([st.ARGS.drafter, "--check-config", "--drafter-kind", "mtp", "--model",
                           mtp_model(), "--feature-dtype", "f16"])
    check(rc != 0 and "bf16|f32" in out, "feature_dtype's values:\n" + out)


def case_vocab():
    """A draft vocabulary (draft_vocab): every third token of the tiny model's
    320 and the last, listed out of order with comments. Outputs stay the plain
    ones; every drafted token is in the list; each block's first draft is the
    best listed token of the head's row as `tandem logits --mtp-out` computes
    it on the CPU with the whole vocabulary; bad lists and kinds are refused."""
    import numpy as np
    model = mtp_model()
    with open(os.path.join(model, "config.json")) as f:
        cfg = json.load(f)
    V = cfg.get("text_config", cfg)["vocab_size"]
    listed = sorted(set(range(0, V, 3)) | {V - 1})
    shuffled = listed[:]
    random.Random(5).shuffle(shuffled)
    path = st.write("vocab.txt", "# every third token\n" +
                    "\n".join("%d, %d  # pair" % (shuffled[i], shuffled[i + 1]) if i + 1 <
                              len(shuffled) else str(shuffled[i])
                              for i in range(0, len(shuffled), 2)) + "\n")
    ps = prompts(4 if st.ARGS.quick else 10, seed=13)

    def head_row(ctx, pos):  # the MTP head's row predicting position pos
        if mtp_reference(model, ctx[:pos - 1], 1, ctx[pos - 1]) is None:
            return None
        return np.load(os.path.join(st.TMP, "mtp-ref.npy"))[pos - 2]

    def model_row(ctx, pos):  # the model's own row predicting position pos
        ref = os.path.join(st.TMP, "model-ref.npy")
        rc, so, se = st.run([st.ARGS.cli, "logits", "--model", model, "--ids",
                             ",".join(map(str, ctx[:pos])), "--out", ref])
        return np.load(ref)[pos - 1] if check(rc == 0, "tandem logits: rc %d %s%s" %
                                              (rc, so, se)) else None

    logged = ["drafting from the %d tokens of %s (of %d)" % (len(listed), path, V)]
    vocab_drafts("mtp", model, ("--draft-vocab", path), logged, listed, ps, head_row)
    vocab_drafts("model", model, ("--draft-vocab", path), logged, listed, ps, model_row)
    # Refusals: a drafter without an LM head, lists that are no lists of this model's ids.
    rc, out, err = st.run([st.ARGS.drafter, "--check-config", "--drafter-kind", "ngram",
                           "--draft-vocab", path])
    check(rc != 0 and "draft-vocab-needs-lm-head" in out and
          "drafter_kind=ngram (flag:--drafter-kind)" in out and
          ("draft_vocab=%s (flag:--draft-vocab)" % path) in out,
          "draft_vocab with an n-gram drafter:\n" + out)
    for name, text, want in (("v-word.txt", "3 6\n9 x12\n", ":2: 'x12' is not a token id"),
                             ("v-range.txt", "1 %d\n" % V, "token %d is outside" % V),
                             ("v-twice.txt", "4\n5\n4\n", "token 4 is listed twice (lines 1 "
                              "and 3)"),
                             ("v-empty.txt", "# nothing\n", "no token ids")):
        bad = st.write(name, text)
        rc, out, err = st.run([st.ARGS.drafter, "--check-config", "--drafter-kind", "mtp",
                               "--model", model, "--draft-vocab", bad])
        check(rc != 0 and want in out and bad in out, "%s: %s\n%s" % (name, want, out))
        rc, out, err = st.run([st.ARGS.drafter, "--drafter-kind", "mtp", "--model", model,
                               "--draft-vocab", bad, "--listen", "127.0.0.1:0",
                               "--health-listen", "127.0.0.1:0", "--gateway", "127.0.0.1:1"])
        check(rc != 0 and want in err and "listening" not in err,
              "%s refused at start: rc %d\n%s" % (name, rc, err[-2000:]))
    rc, out, err = st.run([st.ARGS.drafter, "--check-config", "--drafter-kind", "mtp", "--model",
                           model, "--draft-vocab", path])
    check(rc == 0 and re.search(r"^draft_vocab: +%s +# flag" % re.escape(path), out, re.M),
          "a good list passes --check-config:\n" + out)


def case_fp8():
    """weights fp8 on the MTP drafter: mtp.fc's two halves, the head's layer's
    projections and the untied LM head rounded to FP8 E4M3 at start (the
    drafter logs 9 rounded, and the MLP's down projection, 96 values a row,
    kept as stored; 10 with a draft vocabulary's rows). Outputs stay the plain
    ones, and each block's first draft is the best token of the head's row by
    `tandem logits --mtp-out` on a checkpoint whose head and LM head numpy
    rounded
    (tests/engine/fp8_check.py), the target's layers as stored: the verifier's
    hidden states are the stored target's. With a draft vocabulary (every
    third token) its rows are the rounded LM head's: the same reference."""
    import numpy as np
    sys.path.insert(0, os.path.join(st.ARGS.source, "tests", "engine"))
    import fp8_check
    model = mtp_model()
    with open(os.path.join(model, "config.json")) as f:
        V = json.load(f)["text_config"]["vocab_size"]
    ps = prompts(4 if st.ARGS.quick else 8, seed=17)
    listed = list(range(0, V, 3))
    path = st.write("fp8-vocab.txt", "\n".join(map(str, listed)) + "\n")
    head = lambda name: name.startswith("mtp.") or name == "lm_head.weight"  # noqa: E731
    ref = os.path.join(st.TMP, "fp8-ref")
    fp8_check.rounded_copy(model, ref, head)
    for vocab in (None, path):
        def head_row(ctx, pos):  # the rounded head's row predicting position pos
            if mtp_reference(ref, ctx[:pos - 1], 1, ctx[pos - 1]) is None:
                return None
            return np.load(os.path.join(st.TMP, "mtp-ref.npy"))[pos - 2]

        logged = ["weights fp8: %d matrices of the MTP head rounded to FP8 E4M3, 1 as "
                  "stored" % (10 if vocab else 9), "the LM head: rounded"]
        dargs = ("--weights", "fp8")
        if vocab:
            dargs += ("--draft-vocab", vocab)
            logged += ["drafts read the draft vocabulary's rows, rounded"]
        vocab_drafts("mtp", model, dargs, logged, listed if vocab else list(range(V)), ps,
                     head_row)


def vocab_drafts(kind, model, dargs, logged, listed, ps, row_of):
    """A drafter of `kind` (the MTP head, or the model drafting for itself)
    started with dargs (a draft vocabulary of the tokens listed; weights),
    whose log says each of `logged`: greedy outputs the plain ones, drafts
    only listed tokens, each block's first draft the best listed token of
    row_of(context, position) (the head's or the model's row by `tandem
    logits` on the CPU with the whole vocabulary; None: not checked); sampled
    requests complete speculating."""
    import numpy as np
    gw, v, d, s = stack(model, "f32", drafter_args=dargs, kind=kind)
    kind = " ".join((kind,) + tuple(dargs))
    for line in logged:
        check(line in d.text(), "%s: the drafter logs '%s':\n%s" % (kind, line, d.text()[-2000:]))
    # What it drafts from and with, in its descriptor and `tandem status`.
    weights = "fp8" if "fp8" in dargs else "checkpoint"
    nv = len(listed) if "--draft-vocab" in dargs else 0
    dd = next((r["descriptor"] for r in s["replicas"]
               if r["descriptor"]["replica_id"] == "d-mtp"), {})
    check(dd.get("weights") == weights and dd.get("draft_vocab_size", 0) == nv,
          "%s: descriptor weights %s, draft_vocab_size %s" %
          (kind, dd.get("weights"), dd.get("draft_vocab_size")))
    rc, out, err = st.run([st.ARGS.cli, "status", "--gateway", gw.addr()])
    want = ("draft_vocab %d of %d tokens, " % (nv, dd.get("vocab_size", 0)) if nv else "") + \
        "weights %s, " % weights
    check(rc == 0 and want in out, "%s: tandem status prints '%s':\n%s%s" % (kind, want, out, err))
    plain, spec = run_prompts(gw, ps)
    same_outputs("draft_vocab, %s" % kind, plain, spec)
    blocks = blocks_of(d)
    check(len(blocks) >= len(ps), "%s: blocks were drafted: %d" % (kind, len(blocks)))
    outside = [t for b in blocks for t in b[3] if t not in set(listed)]
    check(not outside, "%s: drafted tokens outside the vocabulary: %s" % (kind, outside[:10]))
    first = {}
    for b in blocks:
        first.setdefault(b[0], b)
    by_len = {len(p): i for i, p in enumerate(ps)}  # first blocks: at the prompt's end
    checked = 0
    for sid, (_, rnd, pos, drafts) in sorted(first.items()):
        i = by_len.get(pos)
        if i is None or not drafts:
            continue
        # the block follows the prompt: its first draft guesses the first generated token
        row = row_of(ps[i] + spec[i][2], pos)
        if row is None:
            continue
        want = listed[int(np.argmax(row[listed]))]
        check(drafts[0] == want, "%s, prompt %d: first draft %d, the best listed token of the "
              "row %d" % (kind, i, drafts[0], want))
        checked += 1
    check(checked >= len(ps) // 2, "%s: first drafts checked: %d" % (kind, checked))
    sampling = {"temperature": 0.8, "top_p": 0.95, "seed": 11}
    res = [generate(gw, p, sampling=sampling) for p in ps[:3]]
    check(all(r[0] == "OK" and r[3] and r[3]["stats"]["speculation"].startswith("on")
              for r in res), "%s, sampled: %s" % (kind, [r[:2] for r in res]))
    print("draft_vocab, %s: %d blocks, %d first drafts checked, %d sampled requests"
          % (kind, len(blocks), checked, len(res)), flush=True)
    stop_all()


def segments(pid):
    """The feature-ring segments process pid has in /dev/shm."""
    try:
        names = os.listdir("/dev/shm")
    except FileNotFoundError:
        return []
    return [n for n in names if n.startswith("tandem-feat-%d-" % pid)]


def run_prompts(gw, ps, **kw):
    """Plain and speculative requests for every prompt, at once: (plain, spec)."""
    jobs = [(p, "SPECULATION_MODE_OFF") for p in ps] + [(p, "SPECULATION_MODE_ON") for p in ps]
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as ex:
        res = list(ex.map(lambda j: generate(gw, j[0], mode=j[1], **kw), jobs))
    return res[:len(ps)], res[len(ps):]


def same_outputs(what, plain, spec, need_spec=True):
    ok = True
    for i, (a, b) in enumerate(zip(plain, spec)):
        ok &= check(a[0] == "OK" and b[0] == "OK" and a[3] and b[3] and b[2] == a[2],
                    "%s prompt %d: speculative %s %s %s != plain %s %s %s" %
                    (what, i, b[0], b[1], b[2], a[0], a[1], a[2]))
        if need_spec and b[3]:
            ok &= check(b[3]["stats"]["speculation"].startswith("on"),
                        "%s prompt %d: speculation %s" % (what, i, b[3]["stats"]["speculation"]))
    return ok


def case_shm():
    model = mtp_model()
    ps = prompts(6 if st.ARGS.quick else 16, seed=11)
    pids, outs = [], {}
    for transport in ("shm", "grpc"):
        gw, v, d, s = stack(model, "bf16", ("--feature-transport", transport),
                            ("--feature-transport", transport))
        pids.append(v.p.pid)
        plain, spec = run_prompts(gw, ps)
        same_outputs(transport, plain, spec)
        outs[transport] = [b[2] for b in spec]
        outs["plain"] = [a[2] for a in plain]
        c = st.counters(v.addr(), "/tandem.v1.Verifier/Describe")
        dc = st.counters(d.addr(), "/tandem.v1.Drafter/Describe")
        print("%s: verifier feature counters %s" %
              (transport, {k: v_ for k, v_ in sorted(c.items()) if k.startswith("feature_")}),
              flush=True)
        check(c.get("speculative_rounds", 0) > 0 and c.get("drafter_failures", 0) == 0,
              "%s: speculation ran without drafter failures: %s" % (transport, c))
        check(c.get("feature_rows_shm", 0) + c.get("feature_rows_grpc", 0) ==
              c.get("feature_rows_sent", -1) and
              c.get("feature_bytes_shm", 0) + c.get("feature_bytes_grpc", 0) ==
              c.get("feature_bytes_sent", -1), "%s: rows by transport add up: %s" % (transport, c))
        if transport == "shm":
            # The rows of the opens sent before the drafter's answer go
            # inline; everything after by the ring.
            check(c.get("feature_streams_shm") == 1 and c.get("feature_streams_grpc", 0) == 0 and
                  c.get("feature_rows_shm", 0) > 0 and
                  c.get("feature_rows_shm", 0) > 2 * c.get("feature_rows_grpc", 0) and
                  c.get("feature_puts_shm", 0) > 0 and c.get("feature_put_us_shm", 0) > 0,
                  "the stream went by shared memory: %s" % c)
            check(dc.get("feature_rows_shm", 0) == c.get("feature_rows_shm", -1) and
                  dc.get("feature_streams_shm") == 1,
                  "the drafter read every ring row the verifier wrote: %s" % dc)
            check("feature stream on shm" in v.text() and
                  "feature rows by shared memory" in d.text(),
                  "both sides log the transport:\n" + v.text()[-2000:] + d.text()[-2000:])
            check(segments(v.p.pid) == [],
                  "the segment left /dev/shm at the handshake: %s" % segments(v.p.pid))
            # The counters reach the gateway with the next heartbeat.
            deadline = time.time() + 10
            while True:
                rc, out, err = st.run([st.ARGS.cli, "status", "--gateway", gw.addr()])
                ok = (rc == 0 and "feature transports: shm" in out and
                      re.search(r"feature stream: 1 Draft stream\(s\) on shm, 0 on grpc; rows "
                                r"\d+ by shm", out) and "ring(s) taken" in out)
                if ok or time.time() > deadline:
                    break
                time.sleep(0.3)
            check(ok, "tandem status shows the transport:\n" + out + err)
        else:
            check(c.get("feature_rows_shm", -1) == 0 and c.get("feature_streams_grpc") == 1 and
                  c.get("feature_puts_grpc", 0) > 0 and dc.get("feature_rows_shm", -1) == 0,
                  "grpc: no row by shared memory: %s / %s" % (c, dc))
            check(segments(v.p.pid) == [], "grpc: no segment made")
        stop_all()
        check(segments(pids[-1]) == [], "%s: nothing left in /dev/shm after exit: %s" %
              (transport, segments(pids[-1])))
    check(outs.get("shm") == outs.get("grpc") == outs.get("plain"),
          "shm, grpc and plain decoding give the same tokens")

    # A ring too small for the long prompts' rows (f32: 256 bytes a row, a
    # 64 KiB ring holds 255): their opens go inline, the verdicts by the ring.
    rnd = random.Random(5)
    longs = [[rnd.randrange(320) for _ in range(n)] for n in (300, 420, 560)]
    gw, v, d, s = stack(model, "f32", ("--feature-transport", "shm", "--feature-shm-size",
                                       "64KiB"))
    pids.append(v.p.pid)
    plain, spec = run_prompts(gw, longs + ps[:3])
    same_outputs("small ring", plain, spec)
    c = st.counters(v.addr(), "/tandem.v1.Verifier/Describe")
    print("small ring: %d messages inline for a full ring, %d rows by shm, %d by grpc" %
          (c.get("feature_ring_full", 0), c.get("feature_rows_shm", 0),
           c.get("feature_rows_grpc", 0)), flush=True)
    # (The first open may go inline before the handshake's answer.)
    check(c.get("feature_ring_full", 0) >= len(longs) - 1 and
          c.get("feature_puts_grpc", 0) >= len(longs) and c.get("feature_rows_shm", 0) > 0 and
          c.get("feature_rows_grpc", 0) >= sum(len(p) - 1 for p in longs) and
          c.get("drafter_failures", 0) == 0,
          "a full ring sends the rows inline, the rest by the ring: %s" % c)
    stop_all()

    # shm set where it cannot work: an error naming the setting, not a
    # quiet fallback. (1) The drafter has its own /dev/shm, as on another
    # host: it cannot open the segment; with auto the stream stays on grpc.
    if shutil.which("unshare") and subprocess.run(
            ["unshare", "-rm", "sh", "-c", "mount -t tmpfs tmpfs /dev/shm"],
            capture_output=True).returncode == 0:
        for vt in ("shm", "auto"):
            gw, v, d, s = stack(model, "bf16", ("--feature-transport", vt), own_shm=True)
            pids.append(v.p.pid)
            plain, spec = run_prompts(gw, ps[:3])
            same_outputs("other host, verifier %s" % vt, plain, spec, need_spec=vt == "auto")
            c = st.counters(v.addr(), "/tandem.v1.Verifier/Describe")
            print("drafter with its own /dev/shm, verifier %s: %s" %
                  (vt, [b[3]["stats"]["speculation"] for b in spec if b[3]]), flush=True)
            if vt == "shm":
                msg = "feature_transport=shm (flag:--feature-transport), but the hidden states " \
                      "cannot go by shared memory to this drafter"
                check(msg in v.text() and "cannot open the verifier's shared-memory segment" in
                      v.text() and c.get("feature_rows_shm", -1) == 0,
                      "verifier shm, drafter elsewhere: an error naming the setting:\n" +
                      v.text()[-3000:])
                check(all(b[3] and "feature_transport=shm" in b[3]["stats"]["speculation"]
                          for b in spec), "the requests say why they ran without speculation: %s"
                      % [b[3]["stats"]["speculation"] for b in spec if b[3]])
            else:
                check(c.get("feature_streams_grpc") == 1 and c.get("feature_rows_shm", -1) == 0 and
                      c.get("feature_rows_grpc", 0) > 0 and c.get("drafter_failures", 0) == 0 and
                      "feature stream on grpc" in v.text(),
                      "auto, drafter elsewhere: grpc: %s\n%s" % (c, v.text()[-2000:]))
            stop_all()
    else:
        print("unshare -rm unavailable: the other-host subcase is skipped", flush=True)
    # (2) A ring /dev/shm cannot hold (64 GiB): the verifier cannot make it.
    # With shm on the verifier its link breaks naming the setting; with shm
    # on the drafter alone its sequences are refused naming its setting.
    gw, v, d, s = stack(model, "bf16", ("--feature-transport", "shm", "--feature-shm-size",
                                        "64GiB"))
    pids.append(v.p.pid)
    plain, spec = run_prompts(gw, ps[:2])
    same_outputs("no room for the ring", plain, spec, need_spec=False)
    print("no room for the ring: %s" % [b[3]["stats"]["speculation"] for b in spec if b[3]],
          flush=True)
    check("feature_transport=shm (flag:--feature-transport), but the hidden states cannot go by "
          "shared memory" in v.text() and "cannot reserve" in v.text(),
          "verifier shm without room: the error names the setting:\n" + v.text()[-3000:])
    stop_all()
    gw, v, d, s = stack(model, "bf16", ("--feature-shm-size", "64GiB"),
                        ("--feature-transport", "shm"))
    pids.append(v.p.pid)
    plain, spec = run_prompts(gw, ps[:2])
    same_outputs("drafter shm, no ring", plain, spec, need_spec=False)
    check("feature_transport=shm (flag:--feature-transport) on this drafter, but this Draft "
          "stream has no shared-memory ring" in d.text(),
          "drafter shm without a ring: its sequences are refused naming the setting:\n" +
          d.text()[-3000:])
    stop_all()
    # (3) shm on one side, grpc on the other: no pairing (the rule names both).
    gw = st.gateway("--replica-ttl", "60s")
    v = st.replica("verifier", gw, "--model", model, "--replica-id", "v1",
                   "--feature-transport", "shm")
    d = st.replica("drafter", gw, "--model", model, "--drafter-kind", "mtp", "--replica-id",
                   "d-mtp", "--feature-transport", "grpc")
    s = st.wait_status(gw, lambda s: st.pair(s, "v1", "d-mtp") is not None, "pair listed")
    p = st.pair(s, "v1", "d-mtp")
    check(p and not p["compatible"] and
          [r["rule"] for r in p["refusals"]] == ["drafter-feature-transport"] and
          "sends hidden states by shm and drafter d-mtp" in p["refusals"][0]["message"],
          "shm against grpc is refused by drafter-feature-transport: %s" % json.dumps(p))
    stop_all()

    # kill -9 of the drafter: the verifier unlinked the segment at the
    # handshake, so nothing is left; it goes on without the drafter.
    gw, v, d, s = stack(model, "bf16")
    pids.append(v.p.pid)
    r = generate(gw, ps[0])
    check(r[0] == "OK" and "feature stream on shm" in v.text(), "auto colocated: shm:\n" +
          v.text()[-2000:])
    d.p.kill()
    d.p.wait()
    check(segments(v.p.pid) == [], "after kill -9 of the drafter: %s" % segments(v.p.pid))
    print("kill -9 of the drafter: no segment left", flush=True)
    r = generate(gw, ps[1], mode="SPECULATION_MODE_AUTO")
    check(r[0] == "OK" and r[2] == outs["plain"][1], "the verifier goes on: %s %s" % (r[0], r[1]))
    stop_all()
    check(all(segments(pid) == [] for pid in pids),
          "no segment of this test's verifiers is left in /dev/shm")


def free_port():
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


def case_restart():
    """A drafter killed and restarted on its address takes its running
    sequences up again: the verifier re-opens each one there with every
    token and the hidden states of every position, the new drafter's blocks
    are the head's drafts from those states, and the output is the plain
    one. (The verifier is stopped while the drafter is replaced, so that the
    sequence is still running when it notices.)"""
    model = mtp_model()
    gw = st.gateway()
    v = st.replica("verifier", gw, "--model", model, "--replica-id", "v1", "--max-draft-tokens",
                   "8")
    port = free_port()
    dargs = ("--model", model, "--drafter-kind", "mtp", "--replica-id", "d-mtp",
             "--draft-block-size", str(BLOCK), "--log-level", "debug",
             "--listen", "127.0.0.1:%d" % port)
    d = st.replica("drafter", gw, *dargs)
    st.wait_status(gw, lambda s: st.pair(s, "v1", "d-mtp") is not None, "pair v1+d-mtp")
    prompt = prompts(1, seed=5)[0]
    n_tok = 1200 if st.ARGS.quick else 3000
    plain = generate(gw, prompt, max_tokens=n_tok, mode="SPECULATION_MODE_OFF")
    check(plain[0] == "OK" and len(plain[2]) == n_tok, "plain run: %s %s" % plain[:2])
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as ex:
        fut = ex.submit(generate, gw, prompt, n_tok)
        deadline = time.time() + 30
        while time.time() < deadline and not blocks_of(d):
            time.sleep(0.01)
        v.p.send_signal(signal.SIGSTOP)
        first = blocks_of(d)
        d.stop(signal.SIGKILL)
        d2 = st.replica("drafter", gw, *dargs)
        v.p.send_signal(signal.SIGCONT)
        r = fut.result(timeout=120)
    check(first, "the first drafter drafted before it was killed")
    check(r[0] == "OK" and r[2] == plain[2],
          "speculative output across the drafter's restart equals the plain one: %s %s" %
          (r[0], r[1]))
    note = r[3]["stats"]["speculation"] if r[3] else ""
    check("re-opened on drafter" in note, "the request's speculation note: %s" % note)
    c = st.counters(v.addr(), "/tandem.v1.Verifier/Describe")
    check(c.get("drafter_reopens", 0) >= 1 and c.get("drafter_failures", 0) >= 1,
          "verifier counters: %s" % c)
    # The new drafter's first block continues the whole output so far: its
    # head was primed from scratch with the states the verifier re-sent.
    later = blocks_of(d2)
    out = prompt + plain[2]
    if check(later and later[0][2] > len(prompt) + 1 + (first[-1][2] - len(prompt) - 1 if first
                                                          else 0),
             "the restarted drafter's blocks (from position %s)" % (later and later[0][2])):
        import numpy as np
        for (_, rnd, pos, drafts) in later[:3]:
            want = mtp_reference(model, out[:pos - 1], BLOCK)
            if not check(want is not None, "tandem logits for position %d" % pos):
                continue
            # The head was primed with the hidden states the verifier decoded
            # position by position; the reference prefills the whole context,
            # whose rows round differently (its matmuls on cuBLAS). The two
            # may part only at a draft whose reference logits tie to rounding.
            j = next((i for i, (a, b) in enumerate(zip(drafts, want)) if a != b), None)
            if j is None:
                continue
            lg = np.load(os.path.join(st.TMP, "mtp-ref.npy"))
            row = lg[lg.shape[0] - BLOCK + j]
            gap = float(row.max() - row[drafts[j]])
            check(gap <= 1e-3 * max(1.0, float(np.abs(row).max())),
                  "after the restart, round %d block at position %d: drafter %s, tandem logits "
                  "%s: draft %d is %.6f below the reference's best" %
                  (rnd, pos, drafts, want, j, gap))
            print("round %d: drafts part at %d, where the reference's logits differ by %.2e" %
                  (rnd, j, gap), flush=True)
    stop_all()


def case_malformed():
    """Feature messages are input like any other: a Python client in the
    verifier's place opens three sequences on one Draft stream to the MTP
    drafter, one with well-formed hidden states and two with malformed ones
    (data one value short; rows that do not start where the drafter is). The
    drafter answers the malformed ones with a SequenceError naming the field
    and goes on drafting for the good one, on the same stream, after a
    verdict with its next row."""
    model = mtp_model()
    gw = st.gateway()
    d = st.replica("drafter", gw, "--model", model, "--drafter-kind", "mtp", "--replica-id",
                   "d-mtp", "--draft-block-size", str(BLOCK), "--feature-transport", "grpc")
    ds = st.DraftStream(d.addr())
    req_cls = ds.req_cls
    H = 64
    rnd = random.Random(3)
    prompt = prompts(1, seed=9)[0]

    def rows(n, short=False):
        vals = [rnd.uniform(-1, 1) for _ in range(n * H)]
        data = b"".join(struct.pack("<f", v) for v in vals)
        return data[:-4] if short else data

    def open_msg(sid, data, position=0, nrows=None):
        m = req_cls()
        o = m.open
        o.sequence_id = sid
        o.tokens.extend(prompt)
        o.block_size = BLOCK
        o.round = 1
        spec = o.features.specs.add()
        spec.final_layer = True
        spec.normed = True
        o.features.dtype = 2  # FEATURE_DTYPE_F32
        h = o.hidden
        h.position = position
        h.rows = len(prompt) - 1 if nrows is None else nrows
        h.width = H
        h.dtype = 2
        h.data = data
        return m

    n = len(prompt) - 1
    ds.put(open_msg(1, rows(n)))
    ds.put(open_msg(2, rows(n, short=True)))
    ds.put(open_msg(3, rows(n), position=5))
    got = []
    sent_verdict = False
    with ds:
        for r in ds.responses:
            got.append(r)
            kind = r.WhichOneof("kind")
            blocks = [x for x in got if x.WhichOneof("kind") == "block"]
            if kind == "block" and r.block.sequence_id == 1 and not sent_verdict:
                # Nothing accepted; the verifier's own next token, and the
                # state of the position the drafter did not have yet.
                v = req_cls()
                v.verdict.sequence_id = 1
                v.verdict.round = r.block.round
                v.verdict.accepted = 0
                v.verdict.next_token = (r.block.tokens[0] + 1) % 320
                v.verdict.block_size = BLOCK
                v.verdict.position = len(prompt) + 1
                h = v.verdict.hidden
                h.position = n
                h.rows = 1
                h.width = H
                h.dtype = 2
                h.data = rows(1)
                ds.put(v)
                sent_verdict = True
            errors = [x for x in got if x.WhichOneof("kind") == "error"]
            if len([b for b in blocks if b.block.sequence_id == 1]) >= 2 and len(errors) >= 2:
                break
    errs = {x.error.sequence_id: x.error.message for x in got if x.WhichOneof("kind") == "error"}
    good = [x.block for x in got if x.WhichOneof("kind") == "block" and x.block.sequence_id == 1]
    bad_blocks = [x.block for x in got if x.WhichOneof("kind") == "block" and
                  x.block.sequence_id in (2, 3) and len(x.block.tokens) > 0]
    print("errors: %s; sequence 1's blocks: %s" % (errs, [list(b.tokens) for b in good]),
          flush=True)
    check(2 in errs and "hidden" in errs[2], "sequence 2 (data one value short): %s" % errs)
    check(3 in errs and "position" in errs[3], "sequence 3 (rows from position 5): %s" % errs)
    check(1 not in errs and len(good) >= 2 and all(len(b.tokens) == BLOCK for b in good),
          "sequence 1 drafts on, before and after a verdict: %s, errors %s" % (good, errs))
    check(not bad_blocks, "no drafts for the malformed sequences: %s" % bad_blocks)
    check(d.p.poll() is None, "the drafter is still running")
    stop_all()


CASES = {"greedy": case_greedy, "sampling": case_sampling, "refusals": case_refusals, "no_head": case_no_head,
         "restart": case_restart, "malformed": case_malformed, "shm": case_shm,
         "vocab": case_vocab, "fp8": case_fp8}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=sorted(CASES))
    for a in ("cli", "gateway", "verifier", "drafter", "make_model", "source"):
        ap.add_argument("--" + a.replace("_", "-"), required=True, dest=a)
    ap.add_argument("--quick", action="store_true")
    st.ARGS = ap.parse_args()
    st.TMP = tempfile.mkdtemp(prefix="tandem-mtp-")
    t0 = time.time()
    try:
        CASES[st.ARGS.case]()
    finally:
        stop_all()
        if st.FAILURES:
            for p in STOPPED:
                print("---- log of %s\n%s" % (p.name, p.text()[-6000:]))
        st.remove_workdir()
    print("%s: %.1f s, %d failure(s)" % (st.ARGS.case, time.time() - t0, len(st.FAILURES)))
    return 1 if st.FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
