"""When a request is done generating: EOS, stop token ids, max_tokens (stop strings need text
and are checked by the engine after detokenizing)."""

from __future__ import annotations

from cadence.core.request import Request, RequestStatus


def check_stop(request: Request, max_model_len: int) -> RequestStatus | None:
    """Status the request finishes with after its latest output token, or None to go on.

    min_tokens holds back EOS and stop tokens (the token is still emitted: the sampler does not
    mask it), never the length limit. A stop token beats the length limit when both apply.
    """
    sampling = request.sampling
    num_output = request.num_output_tokens
    if num_output == 0:
        return None
    last = request.output_token_ids[-1]
    if num_output >= sampling.min_tokens:
        if not sampling.ignore_eos and last in sampling.eos_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if last in sampling.stop_token_ids:
            return RequestStatus.FINISHED_STOPPED
    if num_output >= sampling.max_tokens or request.num_tokens >= max_model_len:
        return RequestStatus.FINISHED_LENGTH
    return None
