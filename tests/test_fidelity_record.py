"""The fidelity record's summaries (fidelity_record.py) by hand: a term's sensitivity and saturation, the terms per
direction that H4 reads."""

import math

import pytest

import fidelity_record


def test_sensitivity_and_saturation_by_hand():
    # three offers, thresholds (0.3, 0.6), CCM weight 1/3; CCM's scaled values 0, 0.5, 1 -> p10 0.1, p90 0.9:
    # moving CCM from 0.1 to 0.9 adds 0.267 to D
    def record(d, ccm, steps):
        return {"D": d, "theta": [0.3, 0.6], "scaled": {"tbd": 0.5, "ccm": ccm, "rsd": 0.5},
                "terms": {"tbd": 0.0, "ccm": sum(steps) / len(steps), "rsd": 0.4},
                "steps": [{"tbd": 0.0, "ccm": s, "rsd": None} for s in steps]}
    records = [record(0.25, 0.0, [0.1]), record(0.5, 0.5, [1.0, 0.2]), record(0.8, 1.0, [1.0, 1.0])]
    out = fidelity_record.sensitivity(records, {"tbd": 0.0, "ccm": 1 / 3, "rsd": 1 / 3})
    # D at (p10, p90): 0.283 / 0.55 (PRP -> XGRPO), 0.367 / 0.633 (XGRPO -> SGT), 0.5 / 0.767 (XGRPO -> SGT)
    assert out["ccm"]["moved"] == pytest.approx(1.0) and "tbd" not in out
    assert (out["ccm"]["p10"], out["ccm"]["p90"]) == pytest.approx((0.1, 0.9))
    # at CCM weight 0.1 the same move adds 0.08: D 0.26 / 0.34 crosses 0.3, 0.46 / 0.54 and 0.71 / 0.79 cross nothing
    light = fidelity_record.sensitivity(records, {"tbd": 0.0, "ccm": 0.1, "rsd": 1 / 3})
    assert light["ccm"]["moved"] == pytest.approx(1 / 3)
    assert out["ccm"]["saturated"] == pytest.approx(1 / 3)       # the third: every step at its cap
    assert out["rsd"]["moved"] == 0.0                            # every offer at the same RSD: p10 = p90
    # at the top of its scale a term cannot get worse either, whatever its steps: RSD scaled to 1 on one offer
    records[0]["scaled"]["rsd"] = 1.0
    assert fidelity_record.sensitivity(records, {"tbd": 0.0, "ccm": 1 / 3, "rsd": 1 / 3})["rsd"]["saturated"] == 1 / 3
    # and below the top every step at its cap saturates it; one step under the cap does not
    records[2]["scaled"]["ccm"] = 0.6
    assert fidelity_record.sensitivity(records, {"ccm": 1 / 3})["ccm"]["saturated"] == pytest.approx(1 / 3)
    records[2]["steps"][0]["ccm"] = 0.9
    assert fidelity_record.sensitivity(records, {"ccm": 1 / 3})["ccm"]["saturated"] == 0.0


def test_an_iterations_fidelity_metrics_by_hand():
    nan = float("nan")

    def scored(level, d, terms, hot, repairs=()):
        return {"level": level, "D": d, "tbd_jaccard": 0.1, "terms": terms, "repairs": list(repairs),
                "steps": [{"hot": h} for h in hot]}
    records = [scored("prp", 0.2, {"tbd": 0.0, "ccm": 0.4, "rsd": nan}, [[], ["ccm"]]),
               scored("sgt", 0.6, {"tbd": 0.2, "ccm": 0.8, "rsd": 0.5}, [["ccm", "rsd"]], repairs=("tbd", "ccm")),
               {"level": "rejected", "repairs": [], "skipped": True},           # predicted, never diagnosed
               {"level": "inert", "repairs": []}]
    out = fidelity_record.fidelity_metrics(records, {"qwen": (0.3, 0.6)}, predictor_accuracy=0.75)
    assert out == pytest.approx({
        "fidelity/offered": 4.0, "fidelity/could_matter": 3 / 4,
        "fidelity/admitted_prp": 1 / 3, "fidelity/admitted_xgrpo": 0.0, "fidelity/admitted_sgt": 1 / 3,
        "fidelity/rejected": 1 / 3, "fidelity/d_mean": 0.4, "fidelity/tbd_jaccard_mean": 0.1,
        "fidelity/tbd_mean": 0.1, "fidelity/ccm_mean": 0.6, "fidelity/rsd_mean": 0.5,        # RSD over the typed one
        "fidelity/repairs_tbd": 1.0, "fidelity/repairs_ccm": 1.0, "fidelity/repairs_rsd": 0.0,
        "fidelity/hotspot_cooccurrence": 1 / 3, "fidelity/predictor_skips": 1.0,
        "fidelity/predictor_accuracy": 0.75, "fidelity/theta1/qwen": 0.3, "fidelity/theta2/qwen": 0.6})


def test_direction_terms_by_hand():
    nan = float("nan")
    records = [{"source": "q", "receiver": "l", "D": 0.5, "dominant": "ccm",
                "terms": {"tbd": 0.0, "ccm": 0.6, "rsd": 0.2}},
               {"source": "q", "receiver": "l", "D": 0.3, "dominant": "rsd",
                "terms": {"tbd": 0.1, "ccm": 0.2, "rsd": 0.4}},
               {"source": "l", "receiver": "q", "D": 0.1, "dominant": "rsd",
                "terms": {"tbd": nan, "ccm": 0.0, "rsd": 0.3}},
               {"source": "l", "receiver": "q", "level": "inert"}]                       # not diagnosed: left out
    out = fidelity_record.direction_terms(records)
    assert list(out) == ["l->q", "q->l"]
    assert (out["q->l"]["diagnosed"] == 2
            and out["q->l"]["terms"] == pytest.approx({"tbd": 0.05, "ccm": 0.4, "rsd": 0.3}))
    assert out["q->l"]["dominant"] == {"tbd": 0.0, "ccm": 0.5, "rsd": 0.5}
    assert math.isnan(out["l->q"]["terms"]["tbd"]) and out["l->q"]["terms"]["rsd"] == pytest.approx(0.3)


def test_tbd_bytes_takes_a_receiver_hotspot_token_back_to_the_source_bytes():
    # "aXXbb" (a | XX | bb) re-encoded as "aYbb" (a | Yb | b): the receiver's "Yb" holds the end of step 0 ("aXX",
    # its "aY") and the start of step 1, so it straddles a boundary the source keeps; in the source's bytes it is
    # [1, 4), beside the inexact group "XXbb" ~ "Ybb" [1, 5)
    from types import SimpleNamespace

    import tokalign
    from test_tokalign import encoding
    source, target = encoding(b"aXXbb", [1, 3]), encoding(b"aYbb", [1, 3])
    offer = SimpleNamespace(source_encoding=source, receiver_encoding=target, steps=[(0, 3), (3, 5)],
                            alignment=tokalign.align(source, target))
    assert fidelity_record.tbd_bytes(offer) == [(1, 4), (1, 5)]



def test_a_records_torn_last_line_is_left_out_and_a_torn_line_before_it_refused(tmp_path):
    lines = ['{"iteration": 1, "receiver": "qwen", "D": 0.5}', '{"iteration": 2, "receiver": "llama", "D": 0.25}']
    (tmp_path / "fidelity.jsonl").write_text("\n".join(lines) + '\n{"iteration": 3, "rec')   # stopped mid-write
    assert fidelity_record.read_records(tmp_path) == [{"iteration": 1, "receiver": "qwen", "D": 0.5},
                                                      {"iteration": 2, "receiver": "llama", "D": 0.25}]
    (tmp_path / "fidelity.jsonl").write_text(f'{lines[0]}\n{{"iter\n{lines[1]}\n')
    with pytest.raises(ValueError, match="line 2 is not a metrics record"):
        fidelity_record.read_records(tmp_path)
