"""The stand-in's model: one transformers causal LM, greedy decoding with the KV cache, memory release.

Contract: `Engine` loads a Hugging Face model folder (fp32, eval mode) onto one device and decodes greedily, or
at temperature T with a `sampler.Sampling` (seeded per request and position), stopping at the config's eos ids, at
stop_token_ids and at stop strings; with a `specdec.Speculator` it decodes the speculative way instead (the same
tokens, greedy or sampled with the same seed). Generation is serialised by a lock (one request at a time), counted
as running or waiting for the load report. `release` really frees the model (deleted, gc, CUDA cache emptied) and
is refused (400) unless idle, as SGLang asserts its scheduler is idle; `resume` reloads it from disk. Generation
while released answers 400. On CPU the torch path of the linear-attention kernels is forced
(`target.force_torch_kernels`; shown as `kernel_backend` in /get_server_info).
"""

from __future__ import annotations

import gc
import inspect
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..target import force_torch_kernels
from . import specdec
from .protocol import BadRequest, log
from .sampler import Sampling

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def torch_kernels() -> str:
    """Force the torch path of the linear-attention kernels (fla cannot run on CPU); the backend bound."""
    return force_torch_kernels()


@dataclass
class Engine:
    model_dir: Path  # absolute path of the model folder
    device: str  # "cpu" or "cuda"
    model: Any = None  # the loaded AutoModelForCausalLM, None while released
    tokenizer: Any = None  # the folder's tokenizer, None when the folder has none
    eos_ids: set[int] = field(default_factory=set)  # the config's (and generation config's) eos ids
    vocab_size: int = 0  # rows of the LM head; input ids must be below it
    lock: threading.Lock = field(default_factory=threading.Lock)  # one generation / release at a time
    ready_at: float = float("inf")  # monotonic time after which /health answers 200
    backend: str = "default"  # linear-attention kernel backend bound ("torch" forced on CPU)
    health_delay: float = 0.0  # seconds a ready /health takes (a real one generates a token)
    token_delay: float = 0.0  # extra seconds per greedy token (a big model decodes slower than the tiny one)
    running: int = 0  # generations decoding now (holding `lock`)
    waiting: int = 0  # generations queued for `lock`
    count_lock: threading.Lock = field(default_factory=threading.Lock)  # guards running / waiting
    spec: specdec.Speculator | None = None  # the DFlash speculative decoder (--speculative-draft), None: plain greedy
    totals: dict = field(default_factory=dict)  # server-wide counters (vLLM's, llama.cpp's /metrics), count_lock
    metrics: bool = False  # llama.cpp protocol: GET /metrics served (llama-server's --metrics), else 501
    spec_stats: str = "none"  # per-request speculative statistics in answers: none | summary | detailed (the
    #                           engines' own switches: SGLang --speculative-decoding-stats, vLLM
    #                           --per-request-spec-decode-metrics)

    # -- loading

    def load(self) -> None:
        """Load (or reload) the model from disk onto the device, fp32, eval mode."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=torch.float32)
        if self.device == "cpu":
            self.backend = torch_kernels()  # after loading: the model's modeling module is imported now
        self.model = model.to(self.device).eval()
        cfg = model.config
        eos: set[int] = set()
        for src in (cfg, getattr(model, "generation_config", None)):
            e = getattr(src, "eos_token_id", None)
            eos |= set(e) if isinstance(e, (list, tuple)) else ({e} if e is not None else set())
        self.eos_ids = {int(i) for i in eos}
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        if self.spec is not None:  # the drafter, checked against this target (CheckpointError names the field)
            self.spec.device = self.device
            self.spec.load(self.model)

    def load_tokenizer(self) -> None:
        if not any((self.model_dir / f).exists() for f in TOKENIZER_FILES):
            return
        from transformers import AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        except Exception as e:  # noqa: BLE001  (a broken tokenizer leaves input_ids usable)
            log(f"no usable tokenizer in {self.model_dir}: {e}")

    def release(self) -> None:
        """Free the model's memory (the weights are reloaded by `resume`). Refused (400) unless idle: SGLang
        asserts that no request runs or waits when it releases."""
        if not self.lock.acquire(blocking=False):
            raise BadRequest(self._not_idle())
        try:
            if self.waiting:
                raise BadRequest(self._not_idle())
            self.model = None
            if self.spec is not None:
                self.spec.release()
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        finally:
            self.lock.release()

    def _not_idle(self) -> str:
        with self.count_lock:
            running, waiting = self.running, self.waiting
        return (
            f"release_memory_occupation needs an idle server: {running} request(s) running, {waiting} "
            "waiting; SGLang asserts its scheduler is idle, so wait until GET /v1/loads reports none"
        )

    @contextmanager
    def generating(self):
        """Hold the generation lock, counted as waiting while queued and as running while held."""
        with self.count_lock:
            self.waiting += 1
        queued = True
        try:
            with self.lock:
                with self.count_lock:
                    self.waiting -= 1
                    self.running += 1
                queued = False
                try:
                    yield
                finally:
                    with self.count_lock:
                        self.running -= 1
        finally:
            if queued:
                with self.count_lock:
                    self.waiting -= 1

    def loads(self) -> dict:
        with self.count_lock:
            return {
                "dp_rank": 0,
                "num_running_reqs": self.running,
                "num_waiting_reqs": self.waiting,
                "num_used_tokens": 0,
            }

    def resume(self) -> None:
        with self.lock:
            if self.model is None:
                self.load()

    # -- decoding

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise BadRequest(
                f"`text` input needs a tokenizer, and the model folder {self.model_dir} has none; "
                "send `input_ids` instead or add tokenizer files to the folder"
            )
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return "" if self.tokenizer is None else self.tokenizer.decode(ids, skip_special_tokens=skip_special)

    def live_model(self):
        """The loaded model; 400 while its memory is released."""
        if self.model is None:
            raise BadRequest(
                "the model's memory is released (POST /release_memory_occupation); "
                "POST /resume_memory_occupation before generating"
            )
        return self.model

    def greedy(
        self,
        ids: list[int],
        max_new: int,
        stop_ids: set[int],
        stops: list[str],
        skip_special: bool = True,
        trim: bool = True,
    ) -> tuple[list[int], str, dict]:
        """Greedy decode with the KV cache: (output ids, text, finish_reason). Caller holds the lock."""
        return self.plain(ids, max_new, stop_ids, stops, skip_special, trim)

    @torch.inference_mode()
    def plain(
        self,
        ids: list[int],
        max_new: int,
        stop_ids: set[int],
        stops: list[str],
        skip_special: bool = True,
        trim: bool = True,
        sampling: Sampling | None = None,
    ) -> tuple[list[int], str, dict]:
        """Decode with the KV cache, greedily or drawing each token with `sampling` (the draw for the token at
        sequence position n seeded by the request's seed and n): (output ids, text, finish_reason). Caller holds
        the lock."""
        model = self.live_model()
        kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        out_ids: list[int] = []
        finish: dict = {"type": "length", "length": max_new}
        text = ""
        if max_new > 0:
            x = torch.tensor([ids], device=self.device)
            out = model(input_ids=x, use_cache=True, logits_to_keep=1)
            while True:
                last = out.logits[0, -1:]  # the token at position len(ids) + len(out_ids)
                tok = int(last[0].argmax()) if sampling is None else sampling.pick(last, [len(ids) + len(out_ids)])[0]
                out_ids.append(tok)
                if tok in stop_ids:
                    finish = {"type": "stop", "matched": tok}
                    break
                if stops and self.tokenizer is not None:
                    text = self.decode(out_ids, skip_special)
                    hit = min(((text.find(s), s) for s in stops if s in text), default=None)
                    if hit is not None:
                        finish = {"type": "stop", "matched": hit[1]}
                        if trim:
                            text = text[: hit[0]]
                        return out_ids, text, finish
                if len(out_ids) >= max_new:
                    break
                if self.token_delay > 0:
                    time.sleep(self.token_delay)
                cache = getattr(out, "cache", None)
                cache = out.past_key_values if cache is None else cache
                out = model(input_ids=torch.tensor([[tok]], device=self.device), use_cache=True, **{kw: cache})
        return out_ids, self.decode(out_ids, skip_special), finish

    def speculative(
        self,
        ids: list[int],
        max_new: int,
        stop_ids: set[int],
        stops: list[str],
        skip_special: bool = True,
        trim: bool = True,
        sampling: Sampling | None = None,
    ) -> tuple[list[int], str, dict, specdec.Counters]:
        """Decode the speculative way (`specdec`), greedily or with `sampling`, stopping as `plain` does: (output
        ids, text, finish_reason, the speculative counters, which each protocol shapes its own way). Caller holds
        the lock."""
        model = self.live_model()

        def stop(out: list[int]) -> dict | None:
            if out[-1] in stop_ids:
                return {"type": "stop", "matched": out[-1]}
            if stops and self.tokenizer is not None:
                text = self.decode(out, skip_special)
                hit = min(((text.find(s), s) for s in stops if s in text), default=None)
                if hit is not None:
                    return {"type": "stop", "matched": hit[1]}
            return None

        out, finish, counters = self.spec.decode(model, ids, max_new, stop, sampling)
        if self.token_delay > 0:  # a slower model: the delay per verify step, as greedy decoding's per token
            time.sleep(self.token_delay * counters.verify_ct)
        text = self.decode(out, skip_special)
        if trim and isinstance(finish.get("matched"), str):
            text = text[: text.find(finish["matched"])]
        return out, text, finish, counters
