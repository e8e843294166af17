"""Bessel functions as fp32 expressions (Cephes j0, j1, y0, y1, i0e, i1e, k0, k1 and sin(x)/x), the algorithms and
coefficient tables PyTorch's Math.h uses, so the two agree to a few fp32 ulps.

Derived from the Cephes Math Library (3-Clause BSD, Copyright (c) 2018, Steven Moshier), as PyTorch's Math.h is.
"""

from __future__ import annotations

import math

import torch

from neuron_dynamo.lowering.fp32_expressions import Value, chbevl, either, exp, log, polevl, sin_cos, sqrt, where

aten = torch.ops.aten

# Cephes coefficients: torch's float tables; the i1/i1e ones are Cephes' single-precision expansions
_BESSEL_J0_PP = (0.0007969367292973471, 0.08283523921074408, 1.239533716464143, 5.447250030587687, 8.74716500199817,
    5.303240382353949, 1.0)
_BESSEL_J0_PQ = (0.0009244088105588637, 0.08562884743544745, 1.2535274390105895, 5.470977403304171, 8.761908832370695,
    5.306052882353947, 1.0)
_BESSEL_J0_QP = (-0.011366383889846916, -1.2825271867050931, -19.553954425773597, -93.20601521237683,
    -177.68116798048806, -147.07750515495118, -51.41053267665993, -6.050143506007285)
_BESSEL_J0_QQ = (64.3178256118178, 856.4300259769806, 3882.4018360540163, 7240.467741956525, 5930.727011873169,
    2062.0933166032783, 242.0057402402914)
_BESSEL_J0_RP = (-4794432209.782018, 1956174919465.5657, -249248344360967.72, 9708622510473064.0)
_BESSEL_J0_RQ = (499.563147152651, 173785.4016763747, 48440965.83399621, 11185553704.535683, 2112775201154.892,
    310518229857422.56, 3.1812195594320496e+16, 1.7108629408104315e+18)
_BESSEL_J1_PP = (0.0007621256162081731, 0.07313970569409176, 1.1271960812968493, 5.112079511468076, 8.424045901417724,
    5.214515986823615, 1.0)
_BESSEL_J1_PQ = (0.0005713231280725487, 0.06884559087544954, 1.105142326340617, 5.073863861286015, 8.399855543276042,
    5.209828486823619, 1.0)
_BESSEL_J1_QP = (0.05108625947501766, 4.982138729512334, 75.82382841325453, 366.7796093601508, 710.8563049989261,
    597.4896124006136, 211.68875710057213, 25.207020585802372)
_BESSEL_J1_QQ = (74.23732770356752, 1056.4488603826283, 4986.410583376536, 9562.318924047562, 7997.041604473507,
    2826.1927851763908, 336.0936078106983)
_BESSEL_J1_RP = (-899971225.7055594, 452228297998.19403, -72749424522181.83, 3682957328638529.0)
_BESSEL_J1_RQ = (620.8364781180543, 256987.25675774884, 83514679.14319493, 22151159547.97925, 4749141220799.914,
    784369607876235.9, 8.952223361846274e+16, 5.322786203326801e+18)
_BESSEL_Y0_YP = (15592.436785523574, -14663929.59039716, 5435264770.518765, -982136065717.9115, 87590639439536.7,
    -3466283033847297.0, 4.4273326857256984e+16, -1.8495080043698668e+16)
_BESSEL_Y0_YQ = (1041.2835366425984, 626107.330137135, 268919633.39381415, 86400248710.3935, 20297961275010.555,
    3171577528429750.5, 2.5059625617265306e+17)
_BESSEL_Y1_YP = (1263204747.9017804, -647355876379.1603, 114509511541823.73, -8127702555013251.0,
    2.024394757135949e+17, -7.788771962659501e+17)
_BESSEL_Y1_YQ = (594.3015923461282, 235564.09294306856, 73481194.44597217, 18760131610.870617, 3882312774962.3857,
    620557727146953.8, 6.871410873553005e+16, 3.9727060811656064e+18)
_I0E_A = (-4.4153416464793395e-18, 3.3307945188222384e-17, -2.431279846547955e-16, 1.715391285555133e-15,
    -1.1685332877993451e-14, 7.676185498604936e-14, -4.856446783111929e-13, 2.95505266312964e-12,
    -1.726826291441556e-11, 9.675809035373237e-11, -5.189795601635263e-10, 2.6598237246823866e-09,
    -1.300025009986248e-08, 6.046995022541919e-08, -2.670793853940612e-07, 1.1173875391201037e-06,
    -4.4167383584587505e-06, 1.6448448070728896e-05, -5.754195010082104e-05, 0.00018850288509584165,
    -0.0005763755745385824, 0.0016394756169413357, -0.004324309995050576, 0.010546460394594998, -0.02373741480589947,
    0.04930528423967071, -0.09490109704804764, 0.17162090152220877, -0.3046826723431984, 0.6767952744094761)
_I0E_B = (-7.233180487874754e-18, -4.830504485944182e-18, 4.46562142029676e-17, 3.461222867697461e-17,
    -2.8276239805165836e-16, -3.425485619677219e-16, 1.7725601330565263e-15, 3.8116806693526224e-15,
    -9.554846698828307e-15, -4.150569347287222e-14, 1.54008621752141e-14, 3.8527783827421426e-13,
    7.180124451383666e-13, -1.7941785315068062e-12, -1.3215811840447713e-11, -3.1499165279632416e-11,
    1.1889147107846439e-11, 4.94060238822497e-10, 3.3962320257083865e-09, 2.266668990498178e-08,
    2.0489185894690638e-07, 2.8913705208347567e-06, 6.889758346916825e-05, 0.0033691164782556943, 0.8044904110141088)
_I1E_A = (9.381537386495773e-09, -4.445059128796328e-08, 2.0032947535521353e-07, -8.568720264695455e-07,
    3.4702513081376785e-06, -1.3273163656039436e-05, 4.781565107550054e-05, -0.00016176081582589674,
    0.0005122859561685758, -0.0015135724506312532, 0.004156422944312888, -0.010564084894626197, 0.024726449030626516,
    -0.05294598120809499, 0.1026436586898471, -0.17641651835783406, 0.25258718644363365)
_I1E_B = (-3.835380385964237e-09, -2.6314688468895196e-08, -2.512236237870209e-07, -3.882564808877691e-06,
    -0.00011058893876262371, -0.009761097491361469, 0.7785762350182801)
_MODIFIED_BESSEL_I1_A = (2.7779141127610464e-18, -2.111421214358166e-17, 1.5536319577362005e-16,
    -1.1055969477353862e-15, 7.600684294735408e-15, -5.042185504727912e-14, 3.223793365945575e-13,
    -1.9839743977649436e-12, 1.1736186298890901e-11, -6.663489723502027e-11, 3.625590281552117e-10,
    -1.8872497517228294e-09, 9.381537386495773e-09, -4.445059128796328e-08, 2.0032947535521353e-07,
    -8.568720264695455e-07, 3.4702513081376785e-06, -1.3273163656039436e-05, 4.781565107550054e-05,
    -0.00016176081582589674, 0.0005122859561685758, -0.0015135724506312532, 0.004156422944312888,
    -0.010564084894626197, 0.024726449030626516, -0.05294598120809499, 0.1026436586898471, -0.17641651835783406,
    0.25258718644363365)
_MODIFIED_BESSEL_I1_B = (7.517296310842105e-18, 4.414348323071708e-18, -4.6503053684893586e-17,
    -3.209525921993424e-17, 2.96262899764595e-16, 3.3082023109209285e-16, -1.8803547755107825e-15,
    -3.8144030724370075e-15, 1.0420276984128802e-14, 4.272440016711951e-14, -2.1015418427726643e-14,
    -4.0835511110921974e-13, -7.198551776245908e-13, 2.0356285441470896e-12, 1.4125807436613782e-11,
    3.2526035830154884e-11, -1.8974958123505413e-11, -5.589743462196584e-10, -3.835380385964237e-09,
    -2.6314688468895196e-08, -2.512236237870209e-07, -3.882564808877691e-06, -0.00011058893876262371,
    -0.009761097491361469, 0.7785762350182801)
_MODIFIED_BESSEL_K0_A = (1.374465435613523e-16, 4.25981614279661e-14, 1.0349695257633842e-11, 1.904516377220209e-09,
    2.5347910790261494e-07, 2.286212103119452e-05, 0.001264615411446926, 0.0359799365153615, 0.3442898999246285,
    -0.5353273932339028)
_MODIFIED_BESSEL_K0_B = (5.300433772686263e-18, -1.6475804301524212e-17, 5.2103915050390274e-17,
    -1.678231096805412e-16, 5.512055978524319e-16, -1.848593377343779e-15, 6.3400764774050706e-15,
    -2.2275133269916698e-14, 8.032890775363575e-14, -2.9800969231727303e-13, 1.140340588208475e-12,
    -4.514597883373944e-12, 1.8559491149547177e-11, -7.957489244477107e-11, 3.577397281400301e-10,
    -1.69753450938906e-09, 8.574034017414225e-09, -4.660489897687948e-08, 2.766813639445015e-07,
    -1.8317555227191195e-06, 1.39498137188765e-05, -0.00012849549581627802, 0.0015698838857300533,
    -0.0314481013119645, 2.4403030820659555)
_MODIFIED_BESSEL_K1_A = (-7.023863479386288e-18, -2.427449850519366e-15, -6.666901694199329e-13,
    -1.4114883926335278e-10, -2.213387630734726e-08, -2.4334061415659684e-06, -0.0001730288957513052,
    -0.006975723859639864, -0.12261118082265715, -0.3531559607765449, 1.5253002273389478)
_MODIFIED_BESSEL_K1_B = (-5.756744483665017e-18, 1.7940508731475592e-17, -5.689462558442859e-17,
    1.838093544366639e-16, -6.057047248373319e-16, 2.038703165624334e-15, -7.019837090418314e-15,
    2.4771544244813043e-14, -8.976705182324994e-14, 3.3484196660784293e-13, -1.2891739609510289e-12,
    5.13963967348173e-12, -2.1299678384275683e-11, 9.218315187605006e-11, -4.1903547593418965e-10,
    2.015049755197033e-09, -1.0345762465678097e-08, 5.7410841254500495e-08, -3.5019606030878126e-07,
    2.406484947837217e-06, -1.936197974166083e-05, 0.00019521551847135162, -0.002857816859622779, 0.10392373657681724,
    2.7206261904844427)
_SQRT_2_OVER_PI = 0.797884560802865355879892119868763737
_QUARTER_PI = 0.785398163397448309615660845819875721
_THREE_QUARTER_PI = 2.356194490192344928846982537459627163
_TWO_OVER_PI = 0.636619772367581343075535053490057448


def _hankel(x: Value, p, q, phase: float, w: Value) -> tuple[Value, Value, Value, Value]:
    """The large-argument pieces of J and Y (x > 5): P = PP/PQ, Q = 5/x·QP/QQ in w, sin and cos of x - phase."""
    pp, pq, qp, qq = p[0], p[1], q[0], q[1]
    big_p = polevl(w, pp) / polevl(w, pq)
    big_q = polevl(w, qp) / polevl(w, qq) * (x.reciprocal() * 5.0)
    sine, cosine = sin_cos(x - phase)
    return big_p, big_q, sine, cosine


def _amplitude(x: Value) -> Value:
    return sqrt(x).reciprocal() * _SQRT_2_OVER_PI


def _j0(x: Value) -> Value:
    """J0 of |x| (Cephes j0): a rational function times (x² - z1²)(x² - z2²) up to 5, Hankel's form beyond."""
    x = x.apply("nl.abs")
    x2 = x * x
    near = (x2 - 5.78318596294678452118) * (x2 - 3.04712623436620863991e1) * polevl(x2, _BESSEL_J0_RP) / polevl(
        x2, _BESSEL_J0_RQ)
    near = where(x < 1e-5, 1.0 - x2 * 0.25, near)
    far_x = where(x <= 5.0, 10.0, x)
    w = (far_x * far_x).reciprocal() * 25.0
    p, q, sine, cosine = _hankel(far_x, (_BESSEL_J0_PP, _BESSEL_J0_PQ), (_BESSEL_J0_QP, _BESSEL_J0_QQ),
                                 _QUARTER_PI, w)
    far = (p * cosine - q * sine) * _amplitude(far_x)
    return where(x <= 5.0, near, far)


def _j1(x: Value) -> Value:
    """J1 (Cephes j1), odd."""
    ax = x.apply("nl.abs")
    x2 = ax * ax
    near = polevl(x2, _BESSEL_J1_RP) / polevl(x2, _BESSEL_J1_RQ) * ax * (x2 - 1.46819706421238932572e1) * (
        x2 - 4.92184563216946036703e1)
    far_x = where(ax <= 5.0, 10.0, ax)
    five = far_x.reciprocal() * 5.0
    p, q, sine, cosine = _hankel(far_x, (_BESSEL_J1_PP, _BESSEL_J1_PQ), (_BESSEL_J1_QP, _BESSEL_J1_QQ),
                                 _THREE_QUARTER_PI, five * five)
    far = (p * cosine - q * sine) * _amplitude(far_x)
    magnitude = where(ax <= 5.0, near, far)
    return where(x < 0.0, -magnitude, magnitude)


def _y0(x: Value) -> Value:
    """Y0 (Cephes y0): -inf at 0, NaN below."""
    x2 = x * x
    near_x = where(x > 0.0, x, 1.0)
    near = polevl(x2, _BESSEL_Y0_YP) / polevl(x2, _BESSEL_Y0_YQ) + log(near_x) * _j0(near_x) * _TWO_OVER_PI
    far_x = where(x <= 5.0, 10.0, x)
    w = (far_x * far_x).reciprocal() * 25.0
    p, q, sine, cosine = _hankel(far_x, (_BESSEL_J0_PP, _BESSEL_J0_PQ), (_BESSEL_J0_QP, _BESSEL_J0_QQ),
                                 _QUARTER_PI, w)
    far = (p * sine + q * cosine) * _amplitude(far_x)
    near = where(x.eq(0.0), -math.inf, where(x < 0.0, math.nan, near))
    return where(x <= 5.0, near, far)


def _y1(x: Value) -> Value:
    """Y1 (Cephes y1): -inf at 0, NaN below."""
    x2 = x * x
    near_x = where(x > 0.0, x, 1.0)
    near = near_x * (polevl(x2, _BESSEL_Y1_YP) / polevl(x2, _BESSEL_Y1_YQ)) + (
        _j1(near_x) * log(near_x) - near_x.reciprocal()) * _TWO_OVER_PI
    far_x = where(x <= 5.0, 10.0, x)
    five = far_x.reciprocal() * 5.0
    p, q, sine, cosine = _hankel(far_x, (_BESSEL_J1_PP, _BESSEL_J1_PQ), (_BESSEL_J1_QP, _BESSEL_J1_QQ),
                                 _THREE_QUARTER_PI, five * five)
    far = (p * sine + q * cosine) * _amplitude(far_x)
    near = where(x.eq(0.0), -math.inf, where(x < 0.0, math.nan, near))
    return where(x <= 5.0, near, far)


def _scaled_i(x: Value, near_coefficients, far_coefficients, odd: bool) -> Value:
    """exp(-|x|)·I_ν(|x|) (Cephes i0e / i1e): Chebyshev series in |x|/2 - 2 up to 8 and in 32/|x| - 2 beyond
    (for I1 the near series is of I1(x)/x); the sign of x for the odd I1."""
    ax = x.apply("nl.abs")
    near = chbevl(ax * 0.5 - 2.0, near_coefficients)
    if odd:
        near = near * ax
    far_x = where(ax <= 8.0, 8.0, ax)
    far = chbevl(far_x.reciprocal() * 32.0 - 2.0, far_coefficients) / sqrt(far_x)
    magnitude = where(ax <= 8.0, near, far)
    return where(x < 0.0, -magnitude, magnitude) if odd else magnitude


def _unscaled_i(x: Value, near_coefficients, far_coefficients, odd: bool) -> Value:
    """I_ν(x) = exp(|x|)·(the scaled series), multiplied in the order torch does (inf stays inf, not inf·0)."""
    scaled = _scaled_i(x, near_coefficients, far_coefficients, odd)
    return scaled * exp(x.apply("nl.abs"))


def _k(x: Value, near_coefficients, far_coefficients, order: int, scaled: bool) -> Value:
    """K0 / K1 (Cephes k0, k1; `scaled` multiplies by e^x): up to 2 a Chebyshev series in x² - 2 plus the log
    term with I_ν, beyond a series in 8/x - 2; inf at 0 and NaN below. (torch's unscaled K0 takes log(x/2) in
    double, so tiny subnormal x do not give log(0): log x - log 2 here.)"""
    near_x = where(x > 0.0, where(x <= 2.0, x, 1.0), 1.0)
    series = chbevl(near_x * near_x - 2.0, near_coefficients)
    if order == 0:
        i0 = _unscaled_i(near_x, _I0E_A, _I0E_B, odd=False)
        near = series - (log(near_x) - math.log(2.0)) * i0 if not scaled else series - log(near_x * 0.5) * i0
    else:
        i1 = _unscaled_i(near_x, _MODIFIED_BESSEL_I1_A, _MODIFIED_BESSEL_I1_B, odd=True)
        near = log(near_x * 0.5) * i1 + series / near_x
    far_x = where(x > 2.0, x, 4.0)
    far = chbevl(far_x.reciprocal() * 8.0 - 2.0, far_coefficients) / sqrt(far_x)
    if scaled:
        near = near * exp(near_x)
    else:
        far = far * exp(-far_x)
    result = where(x <= 2.0, near, far)
    return where(x.eq(0.0), math.inf, where(either(x.e, x < 0.0, x.isnan()), math.nan, result))


def _spherical_j0(x: Value) -> Value:
    """sin(x)/x, a Taylor polynomial below |x| = 1/2, 0 at ±inf."""
    x2 = x * x
    taylor = polevl(x2, [(-1.0) ** k / math.factorial(2 * k + 1) for k in range(6, -1, -1)])
    sine, _ = sin_cos(x)
    far = sine / x
    result = where(x.apply("nl.abs") < 0.5, taylor, far)
    return where(x.apply("nl.abs").eq(math.inf), 0.0, result)


BESSEL_FUNCTIONS = {
    aten.i0: lambda x: _unscaled_i(x, _I0E_A, _I0E_B, odd=False),
    aten.special_i0e: lambda x: _scaled_i(x, _I0E_A, _I0E_B, odd=False),
    aten.special_i1: lambda x: _unscaled_i(x, _I1E_A, _I1E_B, odd=True),
    aten.special_i1e: lambda x: _scaled_i(x, _I1E_A, _I1E_B, odd=True),
    aten.special_bessel_j0: _j0,
    aten.special_bessel_j1: _j1,
    aten.special_bessel_y0: _y0,
    aten.special_bessel_y1: _y1,
    aten.special_modified_bessel_i0: lambda x: _unscaled_i(x, _I0E_A, _I0E_B, odd=False),
    aten.special_modified_bessel_i1: lambda x: _unscaled_i(x, _MODIFIED_BESSEL_I1_A, _MODIFIED_BESSEL_I1_B, odd=True),
    aten.special_modified_bessel_k0: lambda x: _k(x, _MODIFIED_BESSEL_K0_A, _MODIFIED_BESSEL_K0_B, order=0,
                                                  scaled=False),
    aten.special_modified_bessel_k1: lambda x: _k(x, _MODIFIED_BESSEL_K1_A, _MODIFIED_BESSEL_K1_B, order=1,
                                                  scaled=False),
    aten.special_scaled_modified_bessel_k0: lambda x: _k(x, _MODIFIED_BESSEL_K0_A, _MODIFIED_BESSEL_K0_B, order=0,
                                                         scaled=True),
    aten.special_scaled_modified_bessel_k1: lambda x: _k(x, _MODIFIED_BESSEL_K1_A, _MODIFIED_BESSEL_K1_B, order=1,
                                                         scaled=True),
    aten.special_spherical_bessel_j0: _spherical_j0,
}
"""Each Bessel op's fp32 computation of its one operand."""
