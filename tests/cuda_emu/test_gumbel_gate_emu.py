"""sampling.h's gumbel_cannot_win, the test that lets the Gumbel-max passes skip an id's logs: it must
never skip an id whose exact score would reach the best score (a changed draw). Checked on the words
at its own decision edge and at the exact score's, for best scores from subnormal to 3e38 (where the
scores' rounding makes ties) and weights from just above best to far below it."""
import math

import torch

BESTS = [0.0, 2.0**-140, 0.5, 1.0, 7.3, 16.25, 100.0, 3000.7, 65536.5, 2.0**22, 1e7, 2.0**30, 1e30, 3e38]
GAPS = [0.0, 1e-6, 1e-3, 0.01, 0.1, 0.5, 1.0, 2.0, 4.0, 8.0, 12.0, 14.0, 15.5, 16.3, 16.6, 16.7, 17.0, 20.0,
        40.0, -1e-3, -1.0]
WINDOW = 256  # words on each side of an edge


def _pairs():
    w, best = [], []
    for b in BESTS:
        for sign in (1.0, -1.0):
            bf = torch.tensor(sign * b, dtype=torch.float32)
            for t in GAPS:
                x = (bf.double() - t).float()
                for near in (x, torch.nextafter(x, torch.tensor(math.inf)), torch.nextafter(x, torch.tensor(-math.inf))):
                    w.append(near.item())
                    best.append(bf.item())
    return torch.tensor(w), torch.tensor(best)


def _words(k, gen):
    """Words with (~word) >> 9 = k, so 1 - u = (2k + 1) 2^-24 (sampling.h's uniform_complement)."""
    k = k.clamp(0, 2**23 - 1)
    return ((2**23 - 1 - k) << 9) | torch.randint(0, 512, k.shape, generator=gen)


def _k_of(v):
    return torch.floor((v.clamp(max=1.0) * 2.0**24 - 1) / 2).to(torch.int64)


def _words_at(y, gen):
    """Words whose 1 - u sits within WINDOW steps of y (float64 [pairs]), each u once."""
    return _words(_k_of(y)[:, None] + torch.arange(-WINDOW, WINDOW), gen)


def _words_around(y, gen):
    """2 * WINDOW words whose 1 - u is y times 2^U(-2, 2): the band where the exact score's rounding
    decides between a win, a tie and a loss."""
    return _words(_k_of(y[:, None] * 2.0 ** (torch.rand(len(y), 2 * WINDOW, generator=gen, dtype=torch.float64)
                                             * 4 - 2)), gen)


def test_gate_never_skips_an_id_that_could_win(emu):
    w, best = _pairs()
    gen = torch.Generator().manual_seed(0)
    wd, bd = w.double(), best.double()
    margin = bd.abs() * 2.0**-18 + 2.0**-10
    y_gate = torch.exp(wd - bd + margin).nan_to_num(posinf=1.0)
    y_exact = torch.exp(wd - bd).nan_to_num(posinf=1.0)
    random_words = torch.randint(0, 2**32, (len(w), 2 * WINDOW), generator=gen)
    total_skips = 0
    for words in (_words_at(y_gate, gen), _words_at(y_exact, gen), _words_around(y_exact, gen), random_words):
        skips, errors = emu.gumbel_gate_check(w, best, words)
        assert errors == 0
        total_skips += skips
    assert total_skips > len(w) * WINDOW  # the test skips a good share of these words


def test_gate_decides_at_its_edge(emu):
    """Not vacuous: around its own edge the test both skips and keeps (moderate scores)."""
    w, best = _pairs()
    moderate = (best.abs() <= 100) & (best - w > 0.5) & (best - w < 15)
    w, best = w[moderate], best[moderate]
    y_gate = torch.exp(w.double() - best.double() + best.double().abs() * 2.0**-18 + 2.0**-10)
    words = _words_at(y_gate, torch.Generator().manual_seed(1))
    skips, errors = emu.gumbel_gate_check(w, best, words)
    assert errors == 0 and 0.3 * words.numel() < skips < 0.7 * words.numel()


def test_gate_on_special_values(emu):
    """A NaN or infinite best, or a NaN or +inf weight: no skip; a -inf weight (never drawn) under a
    finite best: always skipped."""
    values = [0.0, 3.5, -1e30, math.inf, -math.inf, math.nan]
    gen = torch.Generator().manual_seed(2)
    for w in values:
        for b in values:
            skips, errors = emu.gumbel_gate_check(torch.tensor([w]), torch.tensor([b]),
                                                  torch.randint(0, 2**32, (1, 64), generator=gen))
            assert errors == 0
            if not math.isfinite(b) or math.isnan(w) or w == math.inf:
                assert skips == 0
            elif w == -math.inf:
                assert skips == 64


def test_linear_gate_never_skips_an_id_that_could_win(emu):
    """The same for weights given linearly (residual sampling): r = exp(w) wherever that is a normal
    float, scored as logf(r) + noise."""
    w, best = _pairs()
    r = torch.exp(w.double()).float()
    keep = (r >= 2.0**-126) & torch.isfinite(r)
    r, best = r[keep], best[keep]
    gen = torch.Generator().manual_seed(3)
    wd, bd = torch.log(r.double()), best.double()
    y_gate = torch.exp(wd - bd + bd.abs() * 2.0**-18 + 2.0**-10).nan_to_num(posinf=1.0)
    y_exact = torch.exp(wd - bd).nan_to_num(posinf=1.0)
    total_skips = 0
    for words in (_words_at(y_gate, gen), _words_at(y_exact, gen), _words_around(y_exact, gen),
                  torch.randint(0, 2**32, (len(r), 2 * WINDOW), generator=gen)):
        skips, errors = emu.gumbel_gate_check(r, best, words, linear=True)
        assert errors == 0
        total_skips += skips
    assert total_skips > len(r) * WINDOW
