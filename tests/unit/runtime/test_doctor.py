"""doctor's capability check (the report itself is read from this machine)."""

from rlkube.runtime.infra.doctor import device_report, main, missing


def test_missing_names_each_capability():
    report = {"cuda_count": 0, "nccl_available": False, "flash_attn_available": False}
    reasons = missing(report, ["cuda", "nccl", "flash_attn", "tpu"])
    assert [r.split(":")[0] for r in reasons] == ["cuda", "nccl", "flash_attn", "--require"]
    assert missing({"cuda_count": 2, "nccl_available": True, "flash_attn_available": True},
                   ["cuda", "nccl", "flash_attn"]) == []


def test_report_on_this_machine(capsys):
    report = device_report()
    assert {"cuda_count", "cuda_version", "nccl_available", "flash_attn_available",
            "attention_backend", "gpus"} <= set(report)
    assert main([]) == 0
    if report["cuda_count"] == 0:
        assert main(["cuda"]) == 1
        assert "cuda" in capsys.readouterr().err
