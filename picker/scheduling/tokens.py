"""TokenEstimator: a request's prompt length in tokens from its prompt text, calibrated from observed usage.

The parser estimates ``prompt_tokens`` as characters / 4 (the reference's rule). Real tokenisers differ by
content: English prose runs ~4-5 characters a token, code ~3, CJK text ~1-2, and a chat request's prompt text is
the JSON of its messages, whose syntax the chat template replaces. Plugins that reason in tokens (the
``tokens`` score mode of ``prefix-cache-scorer``, ``lmetric-scorer``, ``picker-load-scorer``) use this estimate
instead: per target model, characters per token is a moving average of ``len(prompt_text) / usage.prompt_tokens``
over completed responses (PostResponse), starting at ``chars_per_token`` and clamped to [1, 16].

No I/O: the model server's ``/tokenize`` would be exact but costs a round trip per request. Block hashing keeps
its fixed characters-per-block geometry (changing it would orphan every learned block); only counts use this.
"""

from __future__ import annotations

from picker.request.model import InferenceRequest

__all__ = ["DEFAULT_CHARS_PER_TOKEN", "TokenEstimator"]

DEFAULT_CHARS_PER_TOKEN = 4.0
_MIN_CHARS_PER_TOKEN = 1.0
_MAX_CHARS_PER_TOKEN = 16.0
# Enough weight on history that one odd request (a huge base64 image, say) does not swing the estimate.
_ALPHA = 0.05
_MAX_MODELS = 256  # bound the per-model table (model names come from clients)


class TokenEstimator:
    __slots__ = ("_calibrate", "_default", "_ratios")

    def __init__(self, chars_per_token: float = DEFAULT_CHARS_PER_TOKEN, *, calibrate: bool = True) -> None:
        self._default = chars_per_token
        self._calibrate = calibrate
        self._ratios: dict[str, float] = {}

    def chars_per_token(self, model: str) -> float:
        return self._ratios.get(model, self._default)

    def prompt_tokens(self, req: InferenceRequest) -> float:
        """The request's prompt length in tokens (the parser's count when there is no prompt text)."""
        chars = len(req.prompt_text)
        if not chars:
            return float(req.prompt_tokens)
        ratio = self._ratios.get(req.target_model)
        if ratio is None:
            # Uncalibrated: the parser's count (exact when the prompt was given as token ids).
            return float(req.prompt_tokens) if req.prompt_tokens else chars / self._default
        return chars / ratio

    def observe(self, req: InferenceRequest, prompt_tokens: int | None) -> None:
        """Learn from a completed response's ``usage.prompt_tokens``."""
        if not self._calibrate or not prompt_tokens or prompt_tokens <= 0 or not req.prompt_text:
            return
        sample = min(_MAX_CHARS_PER_TOKEN, max(_MIN_CHARS_PER_TOKEN, len(req.prompt_text) / prompt_tokens))
        model = req.target_model
        ratio = self._ratios.get(model)
        if ratio is None:
            if len(self._ratios) >= _MAX_MODELS:
                return
            self._ratios[model] = sample
        else:
            self._ratios[model] = ratio + _ALPHA * (sample - ratio)
