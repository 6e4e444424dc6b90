#!/usr/bin/env bash
# One run of train_lora.py for real, on a GPU machine that has torch, transformers and peft but no network:
# a tiny random Llama and an offline tokenizer are made here, then the trainer is run three times (a run, the
# same run again to see the seed honoured, and a run stopped with SIGTERM). CI cannot do this: it has no GPU
# and no torch. Takes about two minutes.
#
#   OUT=/some/dir bash packages/agent/trainer/device-check.sh        (from the repository root)
#
# $OUT gets at most 7 files: trainer.stdout.jsonl and trainer.stderr (the first run; the other runs' stderr is
# appended to trainer.stderr), rerun.stdout.jsonl, sigterm.stdout.jsonl, and adapter/ (the first run's output).
# What passed and failed is printed to stdout; the exit status is the number of failed checks (0: all passed).
set -u

OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
TRAINER="packages/agent/trainer/train_lora.py"
WORK="$(mktemp -d)"
export PYTHONUNBUFFERED=1
FAILED=0

fail() {
  echo "FAIL: $*"
  FAILED=$((FAILED + 1))
}
# A hung run must not eat the machine's time; coreutils' timeout where there is one.
limit() {
  if command -v timeout >/dev/null 2>&1; then
    timeout -s KILL "$@"
  else
    shift
    "$@"
  fi
}
section() {
  echo
  echo "== [${SECONDS}s] $*"
}

if [ ! -f "$TRAINER" ]; then
  echo "FAIL: $TRAINER not found: run this from the repository root"
  exit 1
fi
echo "out: $OUT  work: $WORK"

section "versions"
"$PY" - <<'EOF' || fail "reading versions"
import sys
print("python", sys.version.split()[0], sys.executable)
for name in ("torch", "transformers", "peft", "tokenizers", "safetensors", "accelerate", "jinja2"):
    try:
        module = __import__(name)
        print(f"{name} {getattr(module, '__version__', '?')}")
    except Exception as e:
        print(f"{name} NOT IMPORTABLE: {e!r}")
import torch
print("cuda available:", torch.cuda.is_available(), "cuda", torch.version.cuda,
      "device:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-",
      "bf16:", torch.cuda.is_available() and torch.cuda.is_bf16_supported())
EOF
nvidia-smi -L || fail "nvidia-smi -L"

section "data, tiny Llama and offline tokenizer in $WORK/base"
"$PY" - "$WORK" <<'EOF' || fail "making the base model, tokenizer and data"
import json, os, re, sys

work = sys.argv[1]
base = os.path.join(work, "base")
os.makedirs(base, exist_ok=True)

# 64 pairs a tiny model can learn something from: each answer follows from its question's number.
colors = ["red", "green", "blue", "amber", "violet", "silver", "black", "white"]
pairs = [
    {"q": f"What colour is crate {i} ?", "a": f"Crate {i} is {colors[(i * 5) % 8]} and sits on shelf {i % 7} .",
     "collection": "crates"}
    for i in range(64)
]
with open(os.path.join(work, "data.ndjson"), "w") as f:
    for p in pairs:
        f.write(json.dumps(p) + "\n")

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SPECIALS = ["<unk>", "<pad>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|end|>"]
torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=32000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
    intermediate_size=128, max_position_embeddings=512, unk_token_id=0, pad_token_id=1, bos_token_id=2,
    eos_token_id=3,
)
model = LlamaForCausalLM(config)
# safetensors is the default since transformers 4.35 and the only format in 5.x (which dropped the
# safe_serialization argument), so no argument is passed.
model.save_pretrained(base)
weights = [n for n in os.listdir(base) if n.endswith(".safetensors")]
assert weights, f"save_pretrained wrote no .safetensors: {os.listdir(base)}"
print("model:", sorted(os.listdir(base)), sum(p.numel() for p in model.parameters()), "parameters")

# No network, so no tokenizer to download: a word-level one over the data's own words (a few hundred ids; the
# model's embedding stays 32000 wide). The same regex as the tokenizers library's Whitespace pre-tokenizer.
texts = [p["q"] for p in pairs] + [p["a"] for p in pairs] + ["Question: Answer:"]
words = sorted({w for t in texts for w in re.findall(r"\w+|[^\w\s]+", t)} - set(SPECIALS))
vocab = {t: i for i, t in enumerate(SPECIALS + words)}
assert len(vocab) <= 32000
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}<|user|> {{ m['content'] }} <|end|>"
    "{% else %}<|assistant|> {{ m['content'] }} <|end|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL_ARGS = {"unk_token": "<unk>", "pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>"}


def with_tokenizers_library():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.add_special_tokens(SPECIALS)
    hf = PreTrainedTokenizerFast(tokenizer_object=tk, **SPECIAL_ARGS)
    hf.chat_template = TEMPLATE
    hf.save_pretrained(base)


def by_hand():
    # The tokenizer.json the tokenizers library would write for the same WordLevel tokenizer, written as JSON:
    # a fallback for when its Python API is missing or has changed. Loading it still needs transformers.
    added = [{"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for t in SPECIALS]
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }
    with open(os.path.join(base, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f)
    with open(os.path.join(base, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": TEMPLATE,
                   "model_max_length": 512, **SPECIAL_ARGS}, f)
    with open(os.path.join(base, "special_tokens_map.json"), "w") as f:
        json.dump(SPECIAL_ARGS, f)


def verify():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base, local_files_only=True)
    ids = tok(pairs[5]["a"], add_special_tokens=False)["input_ids"]
    assert ids and vocab["<unk>"] not in ids, f"known words came out as <unk>: {ids}"
    chat = tok.apply_chat_template([{"role": "user", "content": pairs[5]["q"]}], tokenize=False,
                                   add_generation_prompt=True)
    chat_ids = tok(chat, add_special_tokens=False)["input_ids"]
    assert chat_ids[0] == vocab["<s>"] and vocab["<|user|>"] in chat_ids, f"chat template tokens: {chat_ids}"
    print(f"tokenizer: {type(tok).__name__}, {len(tok)} tokens; chat: {chat!r} -> {chat_ids}")


for how, make in (("the tokenizers library (WordLevel) wrapped as PreTrainedTokenizerFast", with_tokenizers_library),
                  ("a hand-written tokenizer.json", by_hand)):
    try:
        make()
        verify()
        print("tokenizer made with", how)
        break
    except Exception as e:
        print(f"tokenizer with {how} failed: {e!r}")
        for n in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
            if os.path.exists(os.path.join(base, n)):
                os.remove(os.path.join(base, n))
else:
    sys.exit("no tokenizer could be made")
print("base:", sorted(os.listdir(base)))
EOF

write_job() { # name epochs
  "$PY" - "$WORK" "$1" "$2" <<'EOF'
import json, os, sys
work, name, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
job = {
    "id": f"device-check-{name}", "name": f"device-check-{name}", "base_repo": "hangar/tiny-llama",
    "base_revision": "main",
    "params": {"rank": 8, "alpha": 16, "dropout": 0.05, "epochs": epochs, "lr": 0.002, "batch": 4,
               "max_len": 128, "seed": 7},
    "data_path": os.path.join(work, "data.ndjson"), "base_dir": os.path.join(work, "base"),
    "out_dir": os.path.join(work, f"out-{name}"),
}
with open(os.path.join(work, f"{name}.json"), "w") as f:
    json.dump(job, f, indent=1)
EOF
}
write_job run1 3 && write_job run2 3 && write_job run3 100 || fail "writing job.json files"

section "dry run"
"$PY" "$TRAINER" --job "$WORK/run1.json" --out "$WORK/out-run1" --dry-run || fail "dry run (exit $?)"

section "run 1: epochs 3, rank 8, alpha 16, batch 4, seed 7, max_len 128"
start=$SECONDS
limit 150 "$PY" "$TRAINER" --job "$WORK/run1.json" --out "$WORK/out-run1" \
  >"$OUT/trainer.stdout.jsonl" 2>"$OUT/trainer.stderr"
rc=$?
echo "exit $rc after $((SECONDS - start))s; stdout lines: $(wc -l <"$OUT/trainer.stdout.jsonl")"
if [ "$rc" != 0 ]; then
  fail "run 1 exited $rc; its stderr ends:"
  tail -n 30 "$OUT/trainer.stderr"
fi
head -n 3 "$OUT/trainer.stdout.jsonl"
echo "..."
tail -n 2 "$OUT/trainer.stdout.jsonl"

section "run 2: the same job again (seed honoured?)"
echo "== run 2" >>"$OUT/trainer.stderr"
limit 150 "$PY" "$TRAINER" --job "$WORK/run2.json" --out "$WORK/out-run2" \
  >"$OUT/rerun.stdout.jsonl" 2>>"$OUT/trainer.stderr"
rc=$?
echo "exit $rc"
[ "$rc" = 0 ] || fail "run 2 exited $rc"

section "protocol, losses and the adapter"
"$PY" - "$OUT/trainer.stdout.jsonl" "$OUT/rerun.stdout.jsonl" "$WORK/out-run1" "$WORK/base" <<'EOF' || fail "checks of runs 1 and 2 (above)"
import json, math, os, sys

first, second, adapter, base = sys.argv[1:5]
problems = []


def events(path):
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                e = json.loads(line)
                assert isinstance(e, dict) and isinstance(e.get("event"), str)
                out.append(e)
            except Exception:
                problems.append(f"{os.path.basename(path)} line {n} is not a protocol line: {line[:200]!r}")
    return out


a, b = events(first), events(second)
steps_a = [e for e in a if e["event"] == "step"]
steps_b = [e for e in b if e["event"] == "step"]
start = [e for e in a if e["event"] == "start"]
print("events:", {k: sum(1 for e in a if e["event"] == k) for k in ("start", "step", "done", "error")})
if not start or start[0].get("steps") != 48:
    problems.append(f"start event {start[:1]}: expected steps 48 (3 epochs x 64 pairs / batch 4)")
if len(steps_a) != 48 or [e["step"] for e in steps_a] != list(range(1, 49)):
    problems.append(f"{len(steps_a)} step events, expected steps 1..48")
if not a or a[-1]["event"] != "done":
    problems.append(f"run 1 ends with {a[-1:]} instead of done")
for key in ("loss", "lr", "peak_mib", "tokens_per_s"):
    if any(not isinstance(e.get(key), (int, float)) for e in steps_a):
        problems.append(f"a step event lacks a number for {key}")
if steps_a:
    print("first step:", steps_a[0])
    print("last step: ", steps_a[-1])
    first_epoch = sum(e["loss"] for e in steps_a[:16]) / 16
    last_epoch = sum(e["loss"] for e in steps_a[-16:]) / 16
    print(f"mean loss epoch 1 {first_epoch:.4f} -> epoch 3 {last_epoch:.4f}")
    if not last_epoch < first_epoch:
        problems.append("the loss did not go down from epoch 1 to epoch 3")
    if max(e["peak_mib"] for e in steps_a) <= 0:
        problems.append("peak_mib is 0 on a GPU")
    lrs = [e["lr"] for e in steps_a]
    print(f"lr: warmup to {max(lrs):.6f}, last {lrs[-1]:.6f}")

losses_a = [e["loss"] for e in steps_a]
losses_b = [e["loss"] for e in steps_b]
if losses_a == losses_b and losses_a:
    print(f"seed honoured: the {len(losses_a)} losses of run 2 are identical to run 1's")
else:
    n = min(len(losses_a), len(losses_b))
    diffs = [abs(x - y) for x, y in zip(losses_a, losses_b)]
    first_diff = next((i + 1 for i, d in enumerate(diffs) if d != 0), None)
    print(f"losses differ: {len(losses_a)} vs {len(losses_b)} steps; first difference at step {first_diff}; "
          f"max |diff| {max(diffs) if diffs else 'n/a'}")
    for i in range(min(n, 5)):
        print(f"  step {i + 1}: {losses_a[i]!r} vs {losses_b[i]!r}")
    problems.append("the same seed did not give the same losses")

names = sorted(os.listdir(adapter)) if os.path.isdir(adapter) else []
print("adapter files:", names)
if "adapter_config.json" in names and "adapter_model.safetensors" in names:
    cfg = json.load(open(os.path.join(adapter, "adapter_config.json")))
    print("adapter_config:", {k: cfg.get(k) for k in ("peft_type", "task_type", "r", "lora_alpha", "lora_dropout",
                                                       "target_modules", "use_dora", "use_rslora", "bias",
                                                       "base_model_name_or_path", "revision")})
    if cfg.get("r") != 8 or cfg.get("lora_alpha") != 16:
        problems.append("adapter_config r/lora_alpha are not 8/16")
    want = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    if set(cfg.get("target_modules") or []) != want:
        problems.append(f"target_modules {cfg.get('target_modules')} are not the seven projections")
    from safetensors import safe_open

    with safe_open(os.path.join(adapter, "adapter_model.safetensors"), "pt") as f:
        keys = sorted(f.keys())
        b_norms = [float(f.get_tensor(k).float().norm()) for k in keys if "lora_B" in k]
        print(f"safetensors: {len(keys)} tensors, e.g. {keys[0]} {tuple(f.get_tensor(keys[0]).shape)} "
              f"{f.get_tensor(keys[0]).dtype}")
    if len(keys) != 28:
        problems.append(f"{len(keys)} tensors, expected 28 (2 layers x 7 projections x A and B)")
    if not any(n > 0 for n in b_norms):
        problems.append("every lora_B is zero: training changed nothing")
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True)
    PeftModel.from_pretrained(model, adapter)
    print("PeftModel.from_pretrained loads the adapter")
else:
    problems.append("the adapter directory lacks adapter_config.json or adapter_model.safetensors")

for p in problems:
    print("PROBLEM:", p)
sys.exit(1 if problems else 0)
EOF

section "run 3: SIGTERM after the 3rd step"
echo "== run 3 (SIGTERM)" >>"$OUT/trainer.stderr"
"$PY" - "$PY" "$TRAINER" "$WORK/run3.json" "$WORK/out-run3" "$OUT/sigterm.stdout.jsonl" "$OUT/trainer.stderr" <<'EOF' || fail "SIGTERM run (above)"
import json, os, signal, subprocess, sys, time

py, trainer, job, out, stdout_path, stderr_path = sys.argv[1:7]
problems = []
with open(stdout_path, "w") as keep, open(stderr_path, "a") as err:
    p = subprocess.Popen([py, trainer, "--job", job, "--out", out], stdout=subprocess.PIPE, stderr=err, text=True,
                         bufsize=1)
    sent = None
    last = None
    for line in iter(p.stdout.readline, ""):
        keep.write(line)
        last = line
        try:
            e = json.loads(line)
        except ValueError:
            problems.append(f"not a protocol line: {line!r}")
            continue
        if sent is None and e.get("event") == "step" and e.get("step") == 3:
            sent = time.monotonic()
            p.send_signal(signal.SIGTERM)
    try:
        rc = p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = p.wait()
        problems.append("still running 60 s after SIGTERM: killed")
took = time.monotonic() - sent if sent else None
print(f"SIGTERM sent: {sent is not None}; exit {rc}; "
      f"{f'{took:.2f}s' if took is not None else '-'} from SIGTERM to exit; last line: {last.strip() if last else None}")
if sent is None:
    problems.append("never saw step 3, so SIGTERM was not sent")
if rc != 143:
    problems.append(f"exit status {rc}, expected 143")
try:
    if not json.loads(last).get("message", "").startswith("stopped by SIGTERM at step"):
        problems.append("the last line is not the SIGTERM error event")
except Exception:
    problems.append("no last line to read")
left = sorted(os.listdir(out)) if os.path.isdir(out) else []
print("out dir after the stop:", left)
if any(n.startswith("adapter") or n.startswith(".saving") for n in left):
    problems.append("the stopped run left adapter files behind")
if took is not None and took > 10:
    problems.append(f"took {took:.1f}s to stop; the agent's grace is 10 s")
for q in problems:
    print("PROBLEM:", q)
sys.exit(1 if problems else 0)
EOF

section "adapter to $OUT/adapter"
mkdir -p "$OUT/adapter"
cp "$WORK"/out-run1/* "$OUT/adapter/" 2>/dev/null || fail "no adapter files to copy from run 1"
ls -la "$OUT/adapter"

rm -rf "$WORK"
echo
if [ "$FAILED" = 0 ]; then
  echo "device check: all passed in ${SECONDS}s"
else
  echo "device check: $FAILED check(s) failed in ${SECONDS}s"
fi
exit "$FAILED"
