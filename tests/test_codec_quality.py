"""eval/codec_quality: what each codebook adds (notebook 00), on a tiny codec fitted to synthetic audio."""

import math

import numpy as np
import pytest
from test_codec import TINY, synthetic_speechlike

from recipes.embedded.codec_fit import fit_codec
from paper import codec_quality as Q
from paper.notebook_measures import log_mel_db, unstack
from rvqspec_lib.eval.asr import ASR


@pytest.fixture(scope="module")
def wavs():
    return [synthetic_speechlike(1.5, seed=s) for s in (0, 1)]


@pytest.fixture(scope="module")
def codec(wavs):
    return fit_codec(wavs, seed=0, **TINY)


class _Loudness(ASR):
    """A recogniser stand-in: hears "loud" when the audio's RMS is above a threshold, else "quiet"."""

    name = "loudness"

    def transcribe(self, wav, sample_rate):
        return "loud" if float(np.sqrt(np.mean(np.square(wav)))) > 0.01 else "quiet"


def test_labels_are_derived_from_fields(codec):
    conds = Q.conditions(codec, (1, 4), table_codec=codec)
    assert [c["label"] for c in conds] == ["original", "unquantised", "k=1", "k=4", "table k=1", "table k=4"]
    assert [c["condition"] for c in conds] == ["original", "inversion"] + ["codec"] * 4
    assert all(c["label"] == Q.condition_label(c) for c in conds)
    assert [c["decoder"] for c in conds[2:]] == [codec.decoder_kind] * 2 + ["table"] * 2
    assert [c["label"] for c in Q.conditions(codec, (2,))] == ["original", "unquantised", "k=2"]


def test_sweep_and_quality_rows(codec, wavs):
    res = Q.codec_quality(codec, wavs, ["loud", "loud"], (1, 4), _Loudness(), table_codec=codec.with_decoder(None))
    assert res["asr"] == "loudness"
    rows = {r["label"]: r for r in res["rows"]}
    assert set(rows) == {"original", "unquantised", "k=1", "k=4", "table k=1", "table k=4"}
    assert rows["original"]["feature_lsd_db"] == rows["original"]["audio_lsd_db"] == 0.0
    assert rows["unquantised"]["feature_lsd_db"] == 0.0 < rows["unquantised"]["audio_lsd_db"]
    assert rows["k=4"]["feature_lsd_db"] < rows["k=1"]["feature_lsd_db"]  # more codebooks, closer spectra
    assert rows["k=4"]["bits_per_s"] == 4 * math.log2(codec.codebook_size) * codec.frame_rate_hz
    assert rows["original"]["bits_per_s"] is None and all(r["n"] == 2 for r in rows.values())
    assert rows["original"]["wer"] == 0.0 and all(0 <= r["cer"] <= 1 for r in rows.values())
    assert all(len(a) == 2 for a in res["sweep"]["audio"].values())
    assert res["hypotheses"]["original"] == ["loud", "loud"]
    # the table decoder's rows equal the codec's own here (this tiny codec has no neural decoder)
    assert rows["table k=4"]["feature_lsd_db"] == rows["k=4"]["feature_lsd_db"]
    with pytest.raises(ValueError, match="reference texts"):
        Q.codec_quality(codec, wavs, ["loud"], (1,), _Loudness())


def test_residual_variance_falls_stage_by_stage(codec, wavs):
    rows = Q.residual_variance(codec, wavs)
    assert [r["k"] for r in rows] == list(range(1, codec.n_codebooks + 1))
    left = [r["variance_left"] for r in rows]
    assert 0 < left[-1] < left[0] < 1 and all(b <= a + 1e-9 for a, b in zip(left, left[1:]))
    assert sum(r["removed_by_stage"] for r in rows) == pytest.approx(1 - left[-1])
    assert rows[1]["stage_factor"] == pytest.approx(left[1] / left[0])
    assert all(r["unstructured_factor"] == Q.unstructured_stage_factor(16, codec.config.dim) for r in rows)
    with pytest.raises(ValueError, match="at least one"):
        Q.residual_variance(codec, [])


def test_unstructured_stage_factor():
    # 11 bits over 320 dimensions: about 4.7 % of an unstructured residual's variance per stage, at best
    assert Q.unstructured_stage_factor(2048, 320) == pytest.approx(2 ** (-22 / 320))
    assert Q.unstructured_stage_factor(2, 1) == 0.25  # one bit on a scalar Gaussian: a quarter of the variance
    with pytest.raises(ValueError):
        Q.unstructured_stage_factor(1, 8)


def test_log_mel_db_is_the_features_in_decibels(codec, wavs):
    db = log_mel_db(codec, wavs[0])
    mel = unstack(codec, codec.features(wavs[0]))
    assert db.dtype == np.float32 and db.shape == mel.shape
    np.testing.assert_allclose(db, mel * 10 / np.log(10), rtol=1e-6)


def test_plot_spectrograms_shares_one_colour_scale(codec, wavs):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from paper.plots import plot_spectrograms

    a, b = log_mel_db(codec, wavs[0]), log_mel_db(codec, wavs[1]) - 20
    fig = plot_spectrograms([("loud", a, None), ("quieter", b, 1.5)], hop_s=0.02, title="t", db_range=60)
    images = [im for ax in fig.axes for im in ax.get_images()]
    assert len(images) == 2 and len({im.get_clim() for im in images}) == 1
    assert images[0].get_clim() == (pytest.approx(float(a.max()) - 60), pytest.approx(float(a.max())))
    assert "1.5 dB" in fig.axes[1].get_title(loc="left")
    plt.close(fig)
