"""The engine's decode steps run with cuDNN's attention kernel disallowed on CUDA, and only while they run."""
import torch

from selfspec.attention_backends import _each_step_without_cudnn, without_cudnn_attention


def steps():
    for _ in range(3):
        yield torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled()


def test_each_resumption_runs_without_cudnn_attention_and_the_caller_keeps_its_settings():
    assert torch.backends.cuda.cudnn_sdp_enabled()
    seen = [(inside, torch.backends.cuda.cudnn_sdp_enabled()) for inside in _each_step_without_cudnn(steps())]
    # inside a step: cuDNN off, the other kernels on; between steps (the caller's code): as it was
    assert seen == [((False, True), True)] * 3


def test_other_devices_get_the_steps_themselves():
    pieces = steps()
    assert without_cudnn_attention(pieces, torch.device("cpu")) is pieces
    assert list(without_cudnn_attention(steps(), torch.device("cuda"))) == [(False, True)] * 3  # no GPU needed
