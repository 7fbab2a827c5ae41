"""The command line of the torchrun scripts (issue 24, item 6): argparse answers in Vietnamese
(``scripts._cli``), ``ddp_script --resume`` refuses a checkpoint that does not exist in one line
before any process group, ``resume`` says in one line whether it starts fresh, and outputs go
where the command line says (parent folders created), nothing into the current folder."""

import os
import socket
import sys
import time

import pytest
from dpbook import torchrun
from dpbook.scripts import ddp_script, hsdp_script, resume

ENGLISH = ("usage:", "error:", "the following arguments", "invalid choice", "invalid int",
           "invalid float", "unrecognized arguments", "show this help", "options:")


def parse_error(parse, argv, capsys) -> str:
    with pytest.raises(SystemExit) as info:
        parse(argv)
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err


def no_english(text: str) -> None:
    assert not [w for w in ENGLISH if w in text], text


def test_python_dash_m_with_a_bad_value_answers_in_vietnamese(tmp_path):
    out = torchrun.run_process([sys.executable, "-m", "dpbook.scripts.ddp_script",
                                "--epochs", "x"], timeout=60, cwd=tmp_path)
    assert out.returncode == 2
    usage, error = out.stdout.splitlines()[0], out.stdout.splitlines()[-1]
    assert usage.startswith("cách dùng: python -m dpbook.scripts.ddp_script [-h] [--epochs EPOCHS]")
    assert error == "ddp_script: lỗi: đối số --epochs: 'x' không phải số nguyên"
    no_english(out.stdout)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, expected", [
    (["--dtype", "bfloat16"], "ddp_script: lỗi: đối số --dtype: 'bfloat16' không phải lựa chọn "
                              "hợp lệ (chọn một trong 'float32', 'float64')"),
    (["--lr", "nhanh"], "ddp_script: lỗi: đối số --lr: 'nhanh' không phải số thực"),
    (["--epochs"], "ddp_script: lỗi: đối số --epochs: thiếu giá trị (cần đúng một giá trị)"),
    (["--foo", "1"], "ddp_script: lỗi: đối số không nhận ra: --foo 1"),
    (["--resume"], "ddp_script: lỗi: --resume cần --checkpoint FILE: file checkpoint để nạp."),
])
def test_ddp_script_argparse_errors_in_vietnamese(argv, expected, capsys):
    err = parse_error(ddp_script.parse_args, argv, capsys)
    assert err.startswith("cách dùng: python -m dpbook.scripts.ddp_script [-h]")
    assert err.splitlines()[-1] == expected
    no_english(err)


def test_resume_script_names_its_missing_arguments(capsys):
    err = parse_error(resume.parse_args, ["--steps", "6"], capsys)
    assert err.startswith("cách dùng: python -m dpbook.scripts.resume [-h] --ckpt-dir CKPT_DIR")
    assert err.splitlines()[-1] == "resume: lỗi: thiếu đối số bắt buộc: --ckpt-dir, --out"
    no_english(err)


def test_hsdp_script_names_its_missing_positional(capsys):
    err = parse_error(hsdp_script.parse_args, [], capsys)
    assert err.splitlines()[-1] == "hsdp_script: lỗi: thiếu đối số bắt buộc: out_dir"


def test_hsdp_out_dir_need_not_exist_on_every_node(tmp_path, capsys):
    """Review C3/D20: only rank 0 writes (and creates the folder), so a node whose copy of the
    command names a folder it lacks must still start."""
    args = hsdp_script.parse_args([str(tmp_path / "not-yet" / "ket-qua")])
    assert args.out_dir.endswith("ket-qua") and not (tmp_path / "not-yet").exists()
    (tmp_path / "f").write_text("")
    err = parse_error(hsdp_script.parse_args, [str(tmp_path / "f")], capsys)
    assert "là một file" in err.splitlines()[-1]
    no_english(err)


def test_help_is_vietnamese(capsys):
    with pytest.raises(SystemExit) as info:
        ddp_script.parse_args(["-h"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("cách dùng: python -m dpbook.scripts.ddp_script")
    assert "\ntùy chọn:\n" in text and "-h, --help" in text and "in hướng dẫn này rồi thoát" in text
    assert "--resume" in text and "số epoch" in text
    no_english(text)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_resume_from_a_missing_file_stops_in_one_line_before_the_process_group(tmp_path):
    """As torchrun's rank 0 of 2 would see it: rank 1 never comes, so a process group would
    hang; the script must stop at once, exit status 2, one line naming the file."""
    missing = tmp_path / "runs" / "ddp.pt"
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    t0 = time.perf_counter()
    out = torchrun.run_process([sys.executable, "-m", "dpbook.scripts.ddp_script", "--epochs",
                                "3", "--checkpoint", str(missing), "--resume"],
                               timeout=60, env=env, cwd=tmp_path)
    assert time.perf_counter() - t0 < 30
    assert out.returncode == 2, out.stdout
    assert out.stdout.splitlines() == [
        f"ddp_script: lỗi: --resume: không có file checkpoint {str(missing)!r} để nạp. Bỏ "
        "--resume để huấn luyện từ đầu (checkpoint sẽ được ghi vào đúng đường dẫn ấy)."]
    assert list(tmp_path.iterdir()) == []  # nothing created, not even runs/


@pytest.mark.distributed
def test_resume_from_a_missing_file_under_torchrun(tmp_path):
    """Every worker stops on the same line (the first to exit makes torchrun stop the others,
    so each prints its own); torchrun fails; nothing is written."""
    cmd = torchrun.command("dpbook.scripts.ddp_script", ["--checkpoint", "_build/runs/ddp.pt",
                                                         "--resume"], nproc_per_node=2)
    out = torchrun.run_process(cmd, timeout=90, cwd=tmp_path)
    line = ("ddp_script: lỗi: --resume: không có file checkpoint '_build/runs/ddp.pt' để nạp. "
            "Bỏ --resume để huấn luyện từ đầu (checkpoint sẽ được ghi vào đúng đường dẫn ấy).")
    assert out.returncode != 0 and line in out.stdout.splitlines()
    assert "exitcode  : 2" in out.stdout  # torchrun's report: the worker's own exit status
    assert list(tmp_path.iterdir()) == []


def test_the_checkpoint_must_be_a_file_path(tmp_path, capsys):
    err = parse_error(ddp_script.parse_args, ["--checkpoint", str(tmp_path)], capsys)
    assert err.splitlines()[-1] == (f"ddp_script: lỗi: --checkpoint {str(tmp_path)!r} là một "
                                    "thư mục; hãy cho đường dẫn file, ví dụ "
                                    "_build/runs/ddp.pt.")
    err = parse_error(resume.parse_args, ["--ckpt-dir", "c", "--out", str(tmp_path)], capsys)
    assert err.splitlines()[-1].startswith(f"resume: lỗi: --out {str(tmp_path)!r} là một thư mục")
    (tmp_path / "f").write_text("")
    err = parse_error(resume.parse_args, ["--ckpt-dir", str(tmp_path / "f"), "--out", "o.pt"],
                      capsys)
    assert err.splitlines()[-1].startswith(f"resume: lỗi: --ckpt-dir {str(tmp_path / 'f')!r} là "
                                           "một file")


def test_resume_says_whether_it_starts_fresh(tmp_path):
    assert resume.start_line(str(tmp_path / "ck")) == (
        f"Chưa có checkpoint hoàn chỉnh nào trong {str(tmp_path / 'ck')!r}: huấn luyện từ đầu.")
    (tmp_path / "ck" / "step_4").mkdir(parents=True)
    (tmp_path / "ck" / "step_4" / resume.MARKER).write_text("{}")
    assert resume.start_line(str(tmp_path / "ck")) == (
        f"Tiếp tục từ checkpoint {str(tmp_path / 'ck' / 'step_4')!r} (sau bước 4).")


def test_a_python_dash_m_run_writes_only_where_told(tmp_path):
    """The README's command: the checkpoint under _build/runs/, created if missing; nothing
    else in the current folder."""
    out = torchrun.run_process([sys.executable, "-m", "dpbook.scripts.ddp_script", "--epochs",
                                "1", "--num-samples", "32", "--checkpoint",
                                "_build/runs/ddp.pt"], timeout=90, cwd=tmp_path)
    assert out.returncode == 0, out.stdout
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "_build", "_build/runs", "_build/runs/ddp.pt"]
