#!/usr/bin/env python3
"""Hangar's LoRA trainer: Q/A pairs and a base model in, a PEFT adapter out.

Speaks the protocol in docs/training.md ("The trainer"):

    train_lora.py --job job.json --out DIR [--dry-run]

stdout carries only JSON lines, one per event, flushed as written:

    {"event":"start","steps":N}
    {"event":"step","step":i,"loss":x,"lr":y,"peak_mib":m,"tokens_per_s":t}   (+ "eval_loss" at evaluation steps)
    {"event":"done"}                 or  {"event":"error","message":"..."}

Everything else (library logs, warnings, progress bars, anything a C library prints) goes to stderr, which the
agent keeps as event lines. Exit status: 0 done, 1 error, 143 stopped by SIGTERM (no adapter is written then).

--dry-run checks job.json, the data and the base directory without importing torch, prints one
{"event":"plan",...} line and exits 0: a node's operator can run it before torch is even installed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import sys
import tempfile
import time

# LoRA goes on the attention and MLP projections, by the names Llama, Mistral, Qwen, Gemma and Phi-3-style
# models give them; the ones the loaded model really has are used.
TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# Set before torch or transformers are imported. Offline: the base is on disk, and a node with no route out
# must fail at once rather than wait on the Hub. CUBLAS_WORKSPACE_CONFIG: cuBLAS picks the same algorithms
# every run only with it, so the same seed gives the same losses.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

_protocol = None  # the real stdout; see take_stdout()


def take_stdout() -> None:
    """Keep the real stdout for protocol lines and point file descriptor 1 at stderr.

    Libraries print to stdout (some from C, past sys.stdout); a stray line there would be a broken protocol
    line for the agent. After this only emit() writes to the agent's stdout.
    """
    global _protocol
    _protocol = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr


def emit(event: dict) -> None:
    line = json.dumps(event, separators=(",", ":"), allow_nan=False)
    out = _protocol if _protocol is not None else sys.__stdout__
    out.write(line + "\n")
    out.flush()


def note(message: str) -> None:
    """A line for the operator, kept by the agent as an event line."""
    print(message, file=sys.stderr, flush=True)


class JobError(Exception):
    """A job.json, data file or base directory Hangar cannot train from; the message says what and where."""


class Stopped(BaseException):
    """SIGTERM before training started. A BaseException, so library code that catches Exception lets it by."""


# --------------------------------------------------------------------------------------------------------------
# SIGTERM: the agent's cancel. The first one stops the run at the next step boundary (or at once while still
# loading); a second one exits at once, since the agent's SIGKILL is coming anyway.


class _Stop:
    requested = False
    phase = "setup"  # setup | train | save


def _on_sigterm(signum, frame):  # noqa: ARG001 - signal handler signature
    if _Stop.requested:
        try:
            emit({"event": "error", "message": "stopped by a second SIGTERM"})
        finally:
            os._exit(143)
    _Stop.requested = True
    if _Stop.phase == "setup":
        raise Stopped()
    if _Stop.phase == "save":
        note("SIGTERM while saving the adapter: finishing the save (seconds); a second SIGTERM exits at once")


# --------------------------------------------------------------------------------------------------------------
# job.json, the data and the base directory: checked before anything heavy is imported.


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def check_params(params) -> dict:
    if not isinstance(params, dict):
        raise JobError('job.json "params" is not an object of rank, alpha, dropout, epochs, lr, batch, max_len, seed')
    rules = [
        ("rank", _is_int, lambda v: 1 <= v <= 1024, "a whole number from 1 to 1024"),
        ("alpha", _is_num, lambda v: 0 < v <= 1e6, "a number above 0"),
        ("dropout", _is_num, lambda v: 0 <= v < 1, "a number from 0 up to (not including) 1"),
        ("epochs", _is_int, lambda v: 1 <= v <= 1000, "a whole number from 1 to 1000"),
        ("lr", _is_num, lambda v: 0 < v < 1, "a number between 0 and 1, e.g. 0.0002"),
        ("batch", _is_int, lambda v: 1 <= v <= 4096, "a whole number from 1 to 4096"),
        ("max_len", _is_int, lambda v: 16 <= v <= 1 << 20, "a whole number of tokens, at least 16"),
        ("seed", _is_int, lambda v: 0 <= v < 2**32, "a whole number from 0 to 4294967295"),
    ]
    out = {}
    for name, is_type, in_range, accepted in rules:
        if name not in params:
            raise JobError(f'job.json params has no "{name}": {accepted}')
        v = params[name]
        if not is_type(v) or not in_range(v):
            raise JobError(f"job.json params.{name} is {json.dumps(v)}: {accepted}")
        out[name] = v
    return out


def read_pairs(path: str) -> list[dict]:
    """The NDJSON pairs: {"q": "...", "a": "..."} a line, "collection" optional; blank lines skipped."""
    if not os.path.isfile(path):
        raise JobError(f"data_path {path} is not a file")
    pairs = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise JobError(f"{path} line {number} is not JSON: {e.msg}") from None
            if not isinstance(row, dict):
                raise JobError(f'{path} line {number} is not an object with "q" and "a"')
            for key in ("q", "a"):
                if not isinstance(row.get(key), str) or not row[key].strip():
                    raise JobError(f'{path} line {number}: "{key}" is not a non-empty string')
            pairs.append({"q": row["q"], "a": row["a"]})
    if not pairs:
        raise JobError(f"{path} holds no pairs")
    return pairs


TOKENIZER_FILES = ["tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "merges.txt"]


def check_base(base_dir: str) -> dict:
    """What the base directory holds, or JobError naming what is missing."""
    if not os.path.isdir(base_dir):
        raise JobError(f"base_dir {base_dir} is not a directory")
    config_path = os.path.join(base_dir, "config.json")
    if not os.path.isfile(config_path):
        raise JobError(f"base_dir {base_dir} has no config.json: it must hold a Hugging Face model's files")
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise JobError(f"{config_path} is not JSON: {e}") from None
    if not isinstance(config, dict):
        raise JobError(f"{config_path} is not a JSON object")
    names = sorted(os.listdir(base_dir))
    weights = [n for n in names if n.endswith(".safetensors")]
    if not weights:
        pickles = [n for n in names if n.endswith((".bin", ".pt", ".pth"))]
        if pickles:
            raise JobError(
                f"base_dir {base_dir} has only pickled weights ({', '.join(pickles[:3])}): loading a pickle runs "
                "code, so the trainer loads safetensors only; mirror a revision of the model with .safetensors files"
            )
        raise JobError(f"base_dir {base_dir} has no .safetensors weights")
    tokenizer = [n for n in TOKENIZER_FILES if n in names]
    if not any(n in names for n in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        raise JobError(
            f"base_dir {base_dir} has no tokenizer (tokenizer.json, tokenizer.model or vocab.json): "
            "the base's files must include its tokenizer"
        )
    return {
        "config": config,
        "weights": weights,
        "weights_bytes": sum(os.path.getsize(os.path.join(base_dir, n)) for n in weights),
        "tokenizer": tokenizer,
    }


def read_job(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            job = json.load(f)
    except OSError as e:
        raise JobError(f"job file {path} cannot be read: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise JobError(f"job file {path} is not JSON: {e.msg} at line {e.lineno}") from None
    if not isinstance(job, dict):
        raise JobError(f"job file {path} is not a JSON object")
    for key in ("data_path", "base_dir"):
        if not isinstance(job.get(key), str) or not job[key]:
            raise JobError(f'job.json has no "{key}" (a local path the agent writes)')
    return job


def steps_for(pairs: int, batch: int, epochs: int) -> int:
    return epochs * math.ceil(pairs / batch)


def _installed(name: str):
    """A package's version without importing it (importing torch takes seconds and may touch the GPU)."""
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover - Python < 3.8
        return None
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def plan(job: dict, out_dir: str) -> dict:
    params = check_params(job.get("params"))
    pairs = read_pairs(job["data_path"])
    base = check_base(job["base_dir"])
    cfg = base["config"]
    warnings = []
    max_pos = cfg.get("max_position_embeddings")
    if _is_int(max_pos) and params["max_len"] > max_pos:
        warnings.append(f"max_len {params['max_len']} is past the model's max_position_embeddings {max_pos}")
    packages = {name: _installed(name) for name in ("torch", "transformers", "peft", "safetensors", "accelerate")}
    missing = [name for name, v in packages.items() if v is None]
    if missing:
        warnings.append(f"not installed: {', '.join(missing)} (pip install -r requirements.txt)")
    return {
        "event": "plan",
        "model_type": cfg.get("model_type"),
        "architectures": cfg.get("architectures"),
        "weights": base["weights"],
        "weights_bytes": base["weights_bytes"],
        "tokenizer": base["tokenizer"],
        "pairs": len(pairs),
        # An upper bound: pairs whose question alone fills max_len are dropped once tokenized.
        "steps": steps_for(len(pairs), params["batch"], params["epochs"]),
        "params": params,
        "target_modules": TARGET_MODULES,
        "out_dir": out_dir,
        "packages": packages,
        "python": sys.version.split()[0],
        "warnings": warnings,
    }


# --------------------------------------------------------------------------------------------------------------
# Training.


def seed_everything(seed: int, torch) -> None:
    random.seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    try:
        from transformers import set_seed

        set_seed(seed)
    except ImportError:
        pass


def deterministic_kernels(torch) -> None:
    # Same seed, same losses: kernels with a non-deterministic reduction (SDPA's memory-efficient backward splits
    # keys across blocks) take their deterministic path only in strict mode. An op with no deterministic kernel
    # at all would raise; train() then falls back to warn-only mode and says so.
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def encode_pairs(tokenizer, pairs: list[dict], max_len: int) -> tuple[list[tuple[list[int], list[int]]], int, str]:
    """(input_ids, labels) per pair, labels -100 over the question so the loss is on the answer alone.

    The chat template when the tokenizer has one (what an instruct model will see when served), else
    "Question: ...\\nAnswer: ..." closed with EOS. Returns the examples, how many pairs were dropped because
    the question alone fills max_len, and the format used.
    """
    template = getattr(tokenizer, "chat_template", None)
    eos = tokenizer.eos_token_id
    examples = []
    dropped = 0
    fmt = "chat template" if template else "Question/Answer"
    for pair in pairs:
        ids = None
        if template:
            user = [{"role": "user", "content": pair["q"]}]
            try:
                prompt_text = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
                full_text = tokenizer.apply_chat_template(
                    user + [{"role": "assistant", "content": pair["a"]}], tokenize=False
                )
            except Exception as e:  # a template that refuses this shape of conversation
                note(f"the chat template failed ({e}); using the Question/Answer format")
                template = None
                fmt = "Question/Answer"
            else:
                # The template already writes BOS and the turn markers; adding special tokens would double them.
                prompt = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
                ids = tokenizer(full_text, add_special_tokens=False)["input_ids"]
                # The answer starts where the conversation stops matching the prompt: usually len(prompt), less
                # where a template closes the prompt's last token differently once an answer follows.
                boundary = 0
                for a, b in zip(prompt, ids):
                    if a != b:
                        break
                    boundary += 1
        if ids is None:
            prompt = tokenizer(f"Question: {pair['q']}\nAnswer:", add_special_tokens=True)["input_ids"]
            answer = tokenizer(" " + pair["a"], add_special_tokens=False)["input_ids"]
            if eos is not None:
                answer = answer + [eos]
            ids = prompt + answer
            boundary = len(prompt)
        ids = list(ids[:max_len])
        if boundary >= len(ids):
            dropped += 1
            continue
        labels = [-100] * boundary + ids[boundary:]
        examples.append((ids, labels))
    return examples, dropped, fmt


def find_targets(model, torch) -> list[str]:
    linear = sorted(
        {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    )
    targets = [t for t in TARGET_MODULES if t in linear]
    if not targets:
        raise JobError(
            f"none of {', '.join(TARGET_MODULES)} is in this model; its linear layers are named "
            f"{', '.join(linear[:20]) or '(none)'}: this trainer knows Llama-style projections only"
        )
    return targets


def collate(batch, pad_id: int, torch, device):
    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (ids, lab) in enumerate(batch):
        n = len(ids)
        input_ids[row, :n] = torch.tensor(ids, dtype=torch.long)
        labels[row, :n] = torch.tensor(lab, dtype=torch.long)
        mask[row, :n] = 1
    return input_ids.to(device), mask.to(device), labels.to(device)


def save_adapter(model, out_dir: str) -> None:
    """Writes adapter_config.json and adapter_model.safetensors (and PEFT's README.md) into out_dir.

    PEFT writes into a temporary directory inside out_dir and the files are moved up only once all are written,
    so a run killed mid-save leaves no half-written adapter file at the top level, which is all the agent packs.
    """
    tmp = tempfile.mkdtemp(prefix=".saving-", dir=out_dir)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        written = sorted(os.listdir(tmp))
        for required in ("adapter_config.json", "adapter_model.safetensors"):
            if required not in written:
                raise RuntimeError(f"PEFT save_pretrained wrote {', '.join(written)} but no {required}")
        for name in written:
            src = os.path.join(tmp, name)
            if os.path.isfile(src):
                os.replace(src, os.path.join(out_dir, name))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def train(job: dict, out_dir: str) -> None:
    params = check_params(job.get("params"))
    pairs = read_pairs(job["data_path"])
    check_base(job["base_dir"])
    base_dir = job["base_dir"]

    try:
        import torch
        import transformers
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        raise JobError(
            f"{e.name or e} is not installed in {sys.executable}: install packages/agent/trainer/requirements.txt "
            "into the trainer's virtual environment (docs/training.md, 'Installing the trainer on a node')"
        ) from None

    seed = params["seed"]
    seed_everything(seed, torch)

    cuda = torch.cuda.is_available()
    if cuda:
        device = torch.device("cuda", torch.cuda.current_device())
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        where = f"cuda:{device.index} ({torch.cuda.get_device_name(device)})"
    else:
        device = torch.device("cpu")
        dtype = torch.float32
        where = "cpu"

    note(f"loading {base_dir} on {where} in {str(dtype).replace('torch.', '')}")
    tokenizer = AutoTokenizer.from_pretrained(base_dir, local_files_only=True)
    # transformers 4.56 renamed torch_dtype to dtype; 5.x drops the old name.
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    dtype_arg = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    load = {"local_files_only": True, dtype_arg: dtype}
    if cuda:
        load["device_map"] = {"": device.index}
    model = AutoModelForCausalLM.from_pretrained(base_dir, **load)
    if not cuda:
        model.to(device)
    model.config.use_cache = False
    if cuda:
        # Activations are recomputed in the backward pass instead of held: an 8B model at max_len 1024 and batch 4
        # would otherwise hold tens of GiB of them, far past what the job's gpuMiB was sized for.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    targets = find_targets(model, torch)
    # Seeded again here: the LoRA A matrices are drawn now, and how much randomness loading the base used up
    # depends on the library versions, not on the job.
    seed_everything(seed, torch)
    lora = LoraConfig(
        r=params["rank"],
        lora_alpha=params["alpha"],
        lora_dropout=params["dropout"],
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
        use_dora=False,
        use_rslora=False,
    )
    model = get_peft_model(model, lora)
    # The adapter names its base as the repository it came from, not this node's cache path.
    if isinstance(job.get("base_repo"), str):
        model.peft_config["default"].base_model_name_or_path = job["base_repo"]
        if isinstance(job.get("base_revision"), str):
            model.peft_config["default"].revision = job["base_revision"]
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    note(f"LoRA r={params['rank']} alpha={params['alpha']} on {', '.join(targets)}: {trainable} trainable parameters")

    examples, dropped, fmt = encode_pairs(tokenizer, pairs, params["max_len"])
    if dropped:
        note(f"{dropped} of {len(pairs)} pairs dropped: the question alone fills max_len {params['max_len']}")
    if not examples:
        raise JobError(f"every pair's question fills max_len {params['max_len']} tokens: raise max_len")
    note(f"{len(examples)} pairs in the {fmt} format")
    # The held-out pairs (job.json's eval_path): never trained on, only scored now and then, so over-fitting shows
    # on the job's chart as it happens (the held-out loss rising while the training loss falls).
    held = []
    if isinstance(job.get("eval_path"), str) and job["eval_path"]:
        held, _, _ = encode_pairs(tokenizer, read_pairs(job["eval_path"]), params["max_len"])
        note(f"{len(held)} held-out pairs: their loss is reported about ten times in the run")

    batch = params["batch"]
    per_epoch = math.ceil(len(examples) / batch)
    total = params["epochs"] * per_epoch
    warmup = max(1, math.ceil(0.05 * total))

    def lr_factor(step: int) -> float:  # step counts from 0
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))

    trainable_params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable_params, lr=params["lr"], weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    # fp16 gradients through a frozen fp16 base underflow without loss scaling; bf16 and fp32 need none.
    scaler = None
    if cuda and dtype == torch.float16:
        # torch.amp.GradScaler since torch 2.3; torch.cuda.amp's is the older spelling of the same thing.
        amp = getattr(torch, "amp", None)
        scaler = amp.GradScaler("cuda") if hasattr(amp, "GradScaler") else torch.cuda.amp.GradScaler()
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        pad_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0

    eval_every = max(1, total // 10)

    def held_out_loss() -> float:
        # The mean loss per answer token over every held-out pair, without gradients or dropout.
        model.eval()
        total_loss, tokens = 0.0, 0
        with torch.no_grad():
            for start in range(0, len(held), batch):
                input_ids, mask, labels = collate(held[start : start + batch], pad_id, torch, device)
                loss = model(input_ids=input_ids, attention_mask=mask, labels=labels, use_cache=False).loss
                counted = int((labels[:, 1:] != -100).sum().item())
                total_loss += float(loss.float().item()) * counted
                tokens += counted
        model.train()
        return total_loss / max(tokens, 1)

    model.train()
    deterministic_kernels(torch)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    order_rng = random.Random(seed)
    emit({"event": "start", "steps": total})
    _Stop.phase = "train"
    strict = True

    def run_step(items):
        optimizer.zero_grad(set_to_none=True)
        input_ids, mask, labels = collate(items, pad_id, torch, device)
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels, use_cache=False).loss
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(trainable_params, 1.0)
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable_params, 1.0)
            optimizer.step()
        return float(loss.detach().float().item()), int(mask.sum().item())

    step = 0
    for epoch in range(params["epochs"]):
        order = list(range(len(examples)))
        order_rng.shuffle(order)
        for start in range(0, len(order), batch):
            if _Stop.requested:
                emit({"event": "error", "message": f"stopped by SIGTERM at step {step}"})
                sys.exit(143)
            items = [examples[i] for i in order[start : start + batch]]
            lr = schedule.get_last_lr()[0]
            began = time.perf_counter()
            try:
                loss, tokens = run_step(items)
            except RuntimeError as e:
                if not strict or "deterministic" not in str(e):
                    raise
                strict = False
                note(
                    f"an op in this model has no deterministic kernel ({str(e).splitlines()[0]}); going on without "
                    "strict determinism: the same seed may now give slightly different losses"
                )
                torch.use_deterministic_algorithms(True, warn_only=True)
                loss, tokens = run_step(items)
            elapsed = max(time.perf_counter() - began, 1e-9)
            schedule.step()
            step += 1
            if not math.isfinite(loss):
                raise JobError(f"the loss is {loss} at step {step} (epoch {epoch + 1}): lower lr and try again")
            emit(
                {
                    "event": "step",
                    "step": step,
                    "loss": loss,
                    "lr": lr,
                    "peak_mib": int(torch.cuda.max_memory_allocated(device) // 2**20) if cuda else 0,
                    "tokens_per_s": round(tokens / elapsed, 1),
                    **({"eval_loss": held_out_loss()} if held and (step % eval_every == 0 or step == total) else {}),
                }
            )

    if _Stop.requested:
        emit({"event": "error", "message": f"stopped by SIGTERM at step {step}"})
        sys.exit(143)
    _Stop.phase = "save"
    save_adapter(model, out_dir)
    emit({"event": "done"})


def main(argv=None) -> int:
    take_stdout()
    signal.signal(signal.SIGTERM, _on_sigterm)

    class Parser(argparse.ArgumentParser):
        def error(self, message):  # argparse would print usage and exit 2; the agent reads error events
            raise JobError(f"{message} (usage: train_lora.py --job job.json --out DIR [--dry-run])")

    parser = Parser(description="Hangar's LoRA trainer (docs/training.md)")
    parser.add_argument("--job", required=True, help="job.json: the claim's spec plus data_path, base_dir, out_dir")
    parser.add_argument("--out", required=True, help="where adapter_config.json and adapter_model.safetensors go")
    parser.add_argument("--dry-run", action="store_true", help="check the job and print the plan; imports no torch")
    try:
        args = parser.parse_args(argv)
        job = read_job(args.job)
        if args.dry_run:
            emit(plan(job, args.out))
            return 0
        os.makedirs(args.out, exist_ok=True)
        train(job, args.out)
        return 0
    except Stopped:
        emit({"event": "error", "message": "stopped by SIGTERM before training started"})
        return 143
    except JobError as e:
        emit({"event": "error", "message": str(e)})
        return 1
    except SystemExit:
        raise
    except BaseException as e:  # anything else: the agent shows the message and the last stderr lines
        import traceback

        traceback.print_exc(file=sys.stderr)
        message = f"{type(e).__name__}: {e}".strip()
        if "out of memory" in message.lower():
            message += " (lower batch or max_len, or run the job on a GPU with more free memory)"
        emit({"event": "error", "message": message[:2000]})
        return 1


if __name__ == "__main__":
    sys.exit(main())
