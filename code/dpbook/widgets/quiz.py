"""The chapter's self-check: questions mapped to the four learning objectives, answered in the
browser (offline, no kernel) with an explanation and a link to the section that teaches it.

The wrong options are misconceptions learners really hold (FSDP is model parallelism, memory
halves from 2 to 4 GPUs, ZeRO-1 is a ReduceScatter plus an AllReduce…). Every number in a
question or an option is computed here by the package (``costs``, ``memory``, ``averaging``)
when the page runs, so the quiz and the formulas cannot drift apart.

``questions()`` returns the data; ``html(questions)`` one self-contained block (HTML, CSS, a
little JavaScript), which the page displays and the built book keeps as a cell output.
"""

from __future__ import annotations

import html as _html
import json
from dataclasses import asdict, dataclass

from .. import averaging, costs, memory, vi
from ..style import GB

OBJECTIVES = {
    1: "Giải thích mỗi bước DP → DDP → FSDP giải quyết gì, trả giá gì",
    2: "Đổi script một GPU thành DDP (sampler, set_epoch, lưu mô hình)",
    3: "Cấu hình sharding strategy và cách bọc (auto-wrap) của FSDP",
    4: "Tính lượng giao tiếp mỗi bước của DDP và FSDP",
}


@dataclass(frozen=True)
class Option:
    text: str
    why: str  # shown when the reader picks it: why it is right, or which misconception it is


@dataclass(frozen=True)
class Question:
    key: str
    objective: int
    prompt: str
    options: tuple[Option, ...]
    answer: int  # index of the right option
    link: str  # the page that teaches it, relative to book/ch04/ (".html" in the built book)
    section: str  # the section's title on that page, for the reader

    def __post_init__(self):
        if self.objective not in OBJECTIVES or not 0 <= self.answer < len(self.options):
            raise ValueError(f"câu {self.key}: mục tiêu hoặc đáp án không hợp lệ")


def _gb(x: float) -> str:
    return f"{vi.number(x / GB, 1, trim=True)} GB"


def questions() -> list[Question]:
    P, N = 10**9, 8
    psi = 4 * P  # fp32 gradients (DDP) or parameters (FSDP) of one billion parameters
    ddp = costs.ddp_step_bytes(psi, N).total
    fsdp = costs.fsdp_step_bytes(psi, N, "FULL_SHARD").total
    ddp_mem = memory.vram_ledger(P, N, "DDP").total / P
    ddp_state = memory.vram_ledger(P, N, "DDP").state / P
    act = 6 * GB
    two = memory.vram_ledger(P, 2, "FULL_SHARD", activation_bytes=act).total
    four = memory.vram_ledger(P, 4, "FULL_SHARD", activation_bytes=act).total
    one_unit = memory.vram_ledger(P, N, "FULL_SHARD", phase="step", root_unit_params=P)
    grad_op = memory.vram_ledger(P, N, "SHARD_GRAD_OP", phase="step")
    mixed = memory.bytes_per_param("mixed")
    fp32 = memory.bytes_per_param("fp32")
    state2 = memory.vram_ledger(P, 2, "FULL_SHARD").state
    state4 = memory.vram_ledger(P, 4, "FULL_SHARD").state
    batch = averaging.global_batch_size(32, 2, 4)
    q = []

    # Objective 1: what each generation solves and costs
    q.append(Question("dp-cham", 1, "Trên cùng 2 GPU, vì sao DataParallel (DP) thường chậm hơn "
                      "DDP?", (
        Option("DP là một process nhiều thread: GIL, và GPU chính phải scatter mô hình, gather "
               "output, tính giá trị mất mát cho cả batch ở mỗi bước.",
               "Đúng: DDP chạy mỗi GPU một process, không có GPU chính và không có GIL chung."),
        Option("DDP chia mô hình cho các GPU, DP thì không.",
               "Chưa đúng: cả hai giữ bản sao đủ của mô hình trên mỗi GPU; DDP khác ở chỗ mỗi "
               "GPU một process và các process AllReduce gradient."),
        Option("DP luôn nhanh hơn một GPU, chỉ kém DDP chút ít.",
               "Chưa đúng: với mô hình nhỏ, chi phí sao chép mô hình và gom output mỗi bước có "
               "thể lớn hơn phần tính được chia; DP có thể chậm hơn cả một GPU."),
    ), 0, "p1/02-dataparallel", "4.1.2 DataParallel"))
    q.append(Question("fsdp-loai", 1, "FSDP thuộc loại song song nào?", (
        Option("Model parallelism: mỗi GPU tính một phần của mô hình.",
               "Chưa đúng: mỗi GPU vẫn tính toàn bộ mô hình trên phần dữ liệu của nó; FSDP chỉ "
               "chia chỗ lưu tham số, gradient và trạng thái optimizer."),
        Option("Data parallelism: mỗi GPU một phần batch; trạng thái được chia mảnh, gom lại "
               "bằng AllGather khi cần tính.",
               "Đúng: tính toán như DDP, lưu trữ chia mảnh."),
        Option("Pipeline parallelism: các tầng chạy lần lượt trên các GPU.",
               "Chưa đúng: FSDP không chia tầng cho GPU; mỗi GPU chạy mọi tầng."),
    ), 1, "p1/06-fsdp", "4.1.6 FSDP"))
    q.append(Question("ddp-bo-nho", 1, "DDP với tham số fp32 và Adam, cấu hình mặc định: mỗi GPU "
                      "giữ bao nhiêu byte cho mỗi tham số (chưa kể activation)?", (
        Option(f"{vi.number(ddp_state)} byte",
               f"Chưa đủ: đó là tham số + gradient + Adam; DDP còn giữ bản sao gradient trong "
               f"bucket ({vi.number(ddp_mem - ddp_state)} byte) trừ khi "
               f"gradient_as_bucket_view=True."),
        Option(f"{vi.number(ddp_mem)} byte",
               f"Đúng: {fp32[0]} (tham số) + {fp32[1]} (gradient) + {fp32[2]} (Adam) + "
               f"{vi.number(ddp_mem - ddp_state)} (bucket của DDP)."),
        Option(f"{vi.number(ddp_state)}/N byte",
               "Chưa đúng: DDP không chia mảnh gì; chia cho N là FSDP/ZeRO-3."),
    ), 1, "p1/07-so-ke-toan-vram", "4.1.7 Sổ kế toán VRAM"))
    q.append(Question("nua-bo-nho", 1, "Mô hình 1 tỷ tham số, Adam fp32, FULL_SHARD; activation "
                      f"mỗi GPU {_gb(act)} (micro-batch mỗi GPU giữ nguyên). Đi từ 2 lên 4 GPU, "
                      "bộ nhớ mỗi GPU (trạng thái + activation) thay đổi thế nào?", (
        Option(f"Giảm một nửa: {_gb(two)} → {_gb(two / 2)}.",
               "Chưa đúng: chỉ phần trạng thái chia cho N; activation của micro-batch thì không."),
        Option(f"{_gb(two)} → {_gb(four)}.",
               f"Đúng: trạng thái 16P/N giảm từ {_gb(state2)} xuống {_gb(state4)}, activation "
               "giữ nguyên."),
        Option("Không đổi: FSDP gom lại toàn bộ tham số ở mỗi bước.",
               "Chưa đúng: FSDP chỉ gom từng đơn vị khi tính nó, rồi giải phóng."),
    ), 1, "p1/07-so-ke-toan-vram", "4.1.7 Sổ kế toán VRAM"))
    q.append(Question("mixed", 1, "Theo cách đếm của ZeRO, huấn luyện mixed precision với Adam "
                      "cần bao nhiêu byte cho mỗi tham số?", (
        Option("8 byte: một nửa fp32.",
               "Chưa đúng: optimizer còn giữ bản fp32 của trọng số và hai moment fp32."),
        Option(f"{vi.number(sum(mixed))} byte: {' + '.join(map(str, mixed))}.",
               "Đúng: tham số và gradient 16 bit, còn bản fp32 của trọng số và hai moment Adam "
               "nằm trong trạng thái optimizer: bằng đúng fp32 + Adam."),
        Option("12 byte: chỉ trạng thái optimizer.",
               "Chưa đủ: 12 byte là phần optimizer; còn tham số và gradient 16 bit."),
    ), 1, "p1/07-so-ke-toan-vram", "4.1.7 Sổ kế toán VRAM"))

    # Objective 2: a single-GPU script into DDP
    q.append(Question("set-epoch", 2, "Quên gọi sampler.set_epoch(epoch) trong vòng lặp epoch "
                      "thì sao?", (
        Option("Chương trình báo lỗi ở epoch thứ hai.",
               "Chưa đúng: không có lỗi nào; đó mới là chỗ nguy hiểm."),
        Option("Mọi epoch dùng cùng một thứ tự xáo trộn.",
               "Đúng: DistributedSampler xáo bằng seed + epoch; không đổi epoch thì thứ tự không "
               "đổi."),
        Option("Các rank đọc trùng dữ liệu của nhau.",
               "Chưa đúng: các rank vẫn chia nhau dữ liệu, chỉ thứ tự lặp lại."),
    ), 1, "p1/03-ddp", "4.1.3 DDP, DistributedSampler"))
    q.append(Question("khong-sampler", 2, "Chạy DDP trên 4 GPU với DataLoader(shuffle=True), "
                      "không có DistributedSampler. Một epoch là gì?", (
        Option("Mỗi rank duyệt toàn bộ tập dữ liệu: mỗi epoch xem dữ liệu 4 lần.",
               "Đúng: không ai chia dữ liệu cho các rank."),
        Option("DDP tự chia dữ liệu cho các rank.",
               "Chưa đúng: DDP chỉ đồng bộ gradient; chia dữ liệu là việc của sampler."),
        Option("Chương trình treo vì các rank có số batch khác nhau.",
               "Chưa đúng: mọi rank có cùng số batch; chúng chỉ xem cùng dữ liệu."),
    ), 0, "p1/03-ddp", "4.1.3 DDP, DistributedSampler"))
    q.append(Question("luu", 2, "Lưu checkpoint của DDP để nạp lại vào mô hình chưa bọc, cách "
                      "nào đúng?", (
        Option("Mọi rank cùng gọi torch.save(model.state_dict(), 'ckpt.pt').",
               "Chưa đúng: các rank ghi đè cùng một file, và khóa có tiền tố module."),
        Option("Rank 0 lưu model.module.state_dict(), rồi mọi rank gọi dist.barrier().",
               "Đúng: một người ghi, khóa không có tiền tố module., các rank khác chờ đến khi "
               "file xong."),
        Option("Rank 0 lưu model.state_dict(); nạp vào mô hình chưa bọc là được.",
               "Chưa đúng: khóa có tiền tố module. nên load_state_dict của mô hình chưa bọc "
               "báo thiếu khóa."),
    ), 1, "p2/02-ddp-day-du", "4.2.2 DDP đầy đủ"))
    q.append(Question("batch", 2, "4 GPU, batch_size=32 mỗi rank, tích lũy gradient 2 bước. Mỗi "
                      "lần optimizer.step() dùng bao nhiêu mẫu?", (
        Option("32", "Chưa đúng: đó là micro-batch của một rank."),
        Option("64", "Chưa đúng: đã tính tích lũy nhưng quên số rank."),
        Option(vi.number(batch), "Đúng: 32 × 2 bước × 4 rank."),
    ), 2, "p1/01-nen-tang-toan-hoc", "4.1.1 Nền tảng toán học"))
    q.append(Question("set-device", 2, "Trong script chạy bằng torchrun trên 2 node × 4 GPU, "
                      "mỗi process chọn GPU bằng gì?", (
        Option("torch.cuda.set_device(int(os.environ['RANK']))",
               "Chưa đúng: RANK chạy tới 7, còn mỗi node chỉ có cuda:0 đến cuda:3."),
        Option("torch.cuda.set_device(int(os.environ['LOCAL_RANK']))",
               "Đúng: LOCAL_RANK là số thứ tự của process trong node."),
        Option("Không cần: DDP tự chọn GPU.",
               "Chưa đúng: không đặt thì mọi process dùng cuda:0."),
    ), 1, "p2/04-torchrun", "4.2.4 torchrun"))

    # Objective 3: sharding strategy and wrapping
    q.append(Question("zero3-luon-it", 3, "FULL_SHARD (ZeRO-3) có luôn dùng ít bộ nhớ hơn "
                      "SHARD_GRAD_OP (ZeRO-2) không?", (
        Option("Có, luôn luôn: nó chia mảnh thêm cả tham số.",
               "Chưa đúng: khi tính, FULL_SHARD gom lại tham số của đơn vị đang tính; nếu cả mô "
               "hình là một đơn vị thì nó gom cả mô hình."),
        Option("Không nhất thiết: bọc cả mô hình thành một đơn vị thì trong bước, tham số đầy "
               f"đủ ({_gb(one_unit.params)}) cũng như SHARD_GRAD_OP ({_gb(grad_op.params)}).",
               "Đúng: lợi ích của FULL_SHARD trong bước đến từ việc bọc thành nhiều đơn vị."),
        Option("Không: FULL_SHARD luôn tốn hơn vì phải AllGather nhiều hơn.",
               "Chưa đúng: AllGather thêm tốn thời gian giao tiếp, không tốn bộ nhớ lâu dài."),
    ), 1, "p1/06-fsdp", "4.1.6 FSDP, chiến lược chia mảnh"))
    q.append(Question("boc-khoi", 3, "Với FSDP2, muốn mỗi khối Transformer là một đơn vị, bạn "
                      "viết gì?", (
        Option("fully_shard(model)",
               "Chưa đủ: cả mô hình thành một đơn vị, AllGather gom toàn bộ tham số một lần."),
        Option("for block in model.layers: fully_shard(block), rồi fully_shard(model)",
               "Đúng: mỗi khối một đơn vị, phần còn lại (embedding, head) thuộc đơn vị gốc."),
        Option("for block in model.layers: fully_shard(block), không bọc gốc",
               "Chưa đủ: tham số ngoài các khối (embedding, head) không được chia mảnh, và "
               "gradient của chúng không được đồng bộ giữa các rank."),
    ), 1, "p2/03-fsdp-day-du", "4.2.3 FSDP đầy đủ, đơn vị bọc"))
    q.append(Question("hsdp", 3, "Huấn luyện trên 2 node × 8 GPU, mô hình không vừa một GPU. "
                      "Chiến lược nào thường hợp lý nhất?", (
        Option("HYBRID_SHARD: chia mảnh trong node, nhân bản giữa các node.",
               "Đúng: AllGather và ReduceScatter đi trong node (nhanh); giữa các node chỉ còn "
               "AllReduce gradient của shard."),
        Option("FULL_SHARD trên cả 16 GPU.",
               "Chạy được, nhưng mọi AllGather đều đi qua mạng giữa các node, chậm hơn nhiều."),
        Option("NO_SHARD.",
               "Chưa đúng: NO_SHARD giữ đủ trạng thái trên mỗi GPU như DDP; mô hình không vừa."),
    ), 0, "p1/08-chon-ddp-hay-fsdp", "4.1.8 Chọn DDP hay FSDP"))
    q.append(Question("no-shard", 3, "NO_SHARD của FSDP dùng để làm gì?", (
        Option("Tiết kiệm bộ nhớ nhất.", "Chưa đúng: nó không chia mảnh gì."),
        Option("So sánh và gỡ lỗi: cùng trạng thái như DDP, cùng mã FSDP.",
               "Đúng: đổi chiến lược mà giữ nguyên script giúp khoanh vùng lỗi."),
        Option("Chạy trên một GPU duy nhất.",
               "Chưa đúng: nó vẫn chạy nhiều GPU, mỗi GPU đủ trạng thái."),
    ), 1, "p1/06-fsdp", "4.1.6 FSDP, chiến lược chia mảnh"))

    # Objective 4: communication per step
    q.append(Question("ddp-byte", 4, f"DDP với Ring AllReduce, gradient {_gb(psi)} (1 tỷ tham số "
                      f"fp32), {N} GPU. Mỗi GPU gửi đi bao nhiêu byte mỗi bước (chỉ chiều gửi)?", (
        Option(_gb(psi), "Chưa đúng: Ring AllReduce là ReduceScatter rồi AllGather, mỗi pha gửi "
               "(N−1)/N lần dữ liệu."),
        Option(_gb(ddp), "Đúng: 2(N−1)/N × Ψ."),
        Option(_gb(psi * (N - 1)), "Chưa đúng: đó là phần GPU trung tâm gửi lại trong cách "
               "tập trung về một GPU; vòng tròn chia đều việc gửi cho mọi GPU."),
    ), 1, "p1/05-ring-allreduce", "4.1.5 Ring AllReduce"))
    q.append(Question("fsdp-byte", 4, f"Cùng mô hình, FULL_SHARD trên {N} GPU: mỗi GPU gửi đi "
                      "bao nhiêu byte mỗi bước?", (
        Option(_gb(ddp), "Chưa đúng: FULL_SHARD còn AllGather tham số lần thứ hai trong lượt "
               "truyền ngược."),
        Option(f"{_gb(fsdp)} ({vi.number(fsdp / ddp, 1)} lần DDP)",
               "Đúng: AllGather (xuôi) + AllGather (ngược) + ReduceScatter, mỗi phép (N−1)/N × Ψ."),
        Option(f"{_gb(2 * ddp)} (gấp đôi DDP)",
               f"Chưa đúng: ba phép, mỗi phép một nửa AllReduce: {vi.number(fsdp / ddp, 1)} lần, "
               "không phải 2."),
    ), 1, "p1/06-fsdp", "4.1.6 FSDP, giao tiếp"))
    q.append(Question("zero1", 4, "ZeRO-1 (chỉ chia mảnh trạng thái optimizer) giao tiếp gì mỗi "
                      "bước?", (
        Option("ReduceScatter gradient rồi AllReduce tham số.",
               "Chưa đúng: sau bước optimizer mỗi rank có một mảnh tham số mới; gom chúng là "
               "AllGather, không phải AllReduce."),
        Option("ReduceScatter gradient rồi AllGather tham số: cùng lượng byte như DDP.",
               "Đúng: (N−1)/N + (N−1)/N = 2(N−1)/N, như một AllReduce."),
        Option(f"Gấp {vi.number(fsdp / ddp, 1)} lần DDP như FSDP.",
               "Chưa đúng: phần thêm của FSDP là AllGather tham số lần hai trong lượt truyền "
               "ngược; ZeRO-1 không có."),
    ), 1, "p1/06-fsdp", "4.1.6 FSDP, giao tiếp"))
    q.append(Question("bucket", 4, "Bucket của DDP thay đổi điều gì?", (
        Option("Tổng số byte gửi mỗi bước.",
               "Chưa đúng: tổng byte vẫn là 2(N−1)/N × Ψ; bucket đổi lúc gửi và số lần gửi."),
        Option("Lúc gửi: AllReduce một bucket ngay khi gradient của nó xong, chồng lên phần "
               "lượt truyền ngược còn lại.",
               "Đúng: và gom nhiều tensor nhỏ thành ít thông điệp lớn."),
        Option("Số GPU tham gia AllReduce.",
               "Chưa đúng: mọi rank tham gia mọi bucket."),
    ), 1, "p1/04-bucket-overlap", "4.1.4 Bucket và chồng lấp"))
    return q


_STYLE = """
.dpbook-quiz fieldset{border:1px solid #ccc;border-radius:6px;margin:0 0 1rem;padding:.6rem .9rem}
.dpbook-quiz legend{font-weight:600;padding:0 .3rem}
.dpbook-quiz .muc-tieu{font-size:.85em;color:#555;margin:.1rem 0 .4rem}
.dpbook-quiz label{display:block;margin:.25rem 0;cursor:pointer}
.dpbook-quiz .phan-hoi{margin-top:.4rem;padding:.4rem .6rem;border-radius:4px}
.dpbook-quiz .dung{background:#e3f4ec;border-left:4px solid #009E73}
.dpbook-quiz .sai{background:#fbe9e0;border-left:4px solid #D55E00}
"""

_SCRIPT = """
(function(root){
  const data = JSON.parse(root.querySelector('script[type="application/json"]').textContent);
  root.querySelectorAll('fieldset').forEach(function(box){
    const q = data[box.dataset.key];
    const out = box.querySelector('.phan-hoi');
    box.querySelectorAll('input').forEach(function(input){
      input.addEventListener('change', function(){
        const i = Number(input.value);
        const right = i === q.answer;
        out.hidden = false;
        out.className = 'phan-hoi ' + (right ? 'dung' : 'sai');
        out.innerHTML = '';
        const head = document.createElement('strong');
        head.textContent = right ? 'Đúng. ' : 'Chưa đúng. ';
        out.appendChild(head);
        out.appendChild(document.createTextNode(q.options[i].why + ' '));
        const a = document.createElement('a');
        a.href = q.link; a.textContent = 'Xem lại: ' + q.section;
        out.appendChild(a);
      });
    });
  });
})(document.currentScript.parentElement);
"""


def html(qs: list[Question] | None = None, suffix: str = ".html") -> str:
    """The quiz as one block: each question a group of radio buttons; picking one shows whether
    it is right, why, and a link to the section (``suffix``: ``.html`` in the built book)."""
    qs = questions() if qs is None else qs
    data = {q.key: {**asdict(q), "link": q.link + suffix} for q in qs}
    parts = [f'<div class="dpbook-quiz"><style>{_STYLE}</style>']
    for n, q in enumerate(qs, 1):
        e = _html.escape
        parts.append(f'<fieldset data-key="{e(q.key)}"><legend>Câu {n}. {e(q.prompt)}</legend>'
                     f'<p class="muc-tieu">Mục tiêu {q.objective}: {e(OBJECTIVES[q.objective])}</p>')
        for i, opt in enumerate(q.options):
            parts.append(f'<label><input type="radio" name="{e(q.key)}" value="{i}"> '
                         f'{e(opt.text)}</label>')
        parts.append('<div class="phan-hoi" hidden></div></fieldset>')
    payload = json.dumps(data, ensure_ascii=False).replace("</", "<\\/")
    parts.append(f'<script type="application/json">{payload}</script>'
                 f"<script>{_SCRIPT}</script></div>")
    return "".join(parts)


def show() -> None:
    """Display the quiz in a notebook (the built book keeps it as the cell's HTML output)."""
    from IPython.display import HTML, display

    display(HTML(html()))
