"""Numbers that .md pages (no code cells) state, recomputed with the package and looked up in
the page, so that the prose and the formulas cannot drift apart."""

import pytest

from dpbook import costs, memory

GB = 1e9


@pytest.fixture(scope="module")
def p1(root):
    return (root / "book" / "ch04" / "p1" / "index.md").read_text(encoding="utf-8")


def test_worked_example_of_part_4_1(p1):
    P, N = 10**9, 8
    psi = 4 * P
    ddp = costs.ddp_step_bytes(psi, N).total / GB
    fsdp = costs.fsdp_step_bytes(psi, N, "FULL_SHARD").total / GB
    assert (ddp, fsdp) == (7, 10.5)
    assert "= 7\\ \\text{GB}" in p1 and "= 10{,}5\\ \\text{GB}" in p1
    ddp_state = memory.vram_ledger(P, N, "DDP").state / GB
    fsdp_state = memory.vram_ledger(P, N, "FULL_SHARD").state / GB
    assert (ddp_state, fsdp_state) == (16, 2)
    assert "= 16$ GB" in p1 and "= 2$ GB" in p1
    # 7B parameters: 112 GB per GPU under DDP, 14 GB under FULL_SHARD on 8 GPUs
    assert memory.vram_ledger(7 * P, N, "DDP").state / GB == 112
    assert memory.vram_ledger(7 * P, N, "FULL_SHARD").state / GB == 14
    assert "= 112$ GB" in p1 and "= 14$ GB" in p1
    # at 100 GB/s: 70 ms and 105 ms of pure transfer
    t_ddp = costs.alpha_beta_time("all_reduce", psi, N, alpha=0, bandwidth=100 * GB)
    t_fsdp = 2 * costs.alpha_beta_time("all_gather", psi, N, 0, 100 * GB) + \
        costs.alpha_beta_time("reduce_scatter", psi, N, 0, 100 * GB)
    assert round(t_ddp * 1e3, 6) == 70 and round(t_fsdp * 1e3, 6) == 105
    assert "70 ms" in p1 and "105 ms" in p1
    # 16-bit gradients halve Psi: DDP sends 3.5 GB
    assert costs.ddp_step_bytes(2 * P, N).total / GB == 3.5 and "3,5 GB" in p1
    # 16 bytes per parameter in both conventions
    assert sum(memory.bytes_per_param("fp32")) == sum(memory.bytes_per_param("mixed")) == 16


def test_chapter_intro_formulas(root):
    text = (root / "book" / "ch04" / "index.md").read_text(encoding="utf-8")
    for n in (2, 8, 64):
        assert costs.fsdp_step_bytes(1.0, n).total / costs.ddp_step_bytes(1.0, n).total == pytest.approx(1.5)
    assert "2\\frac{N-1}{N}\\Psi" in text and "3\\frac{N-1}{N}\\Psi" in text
