"""A small conversation in the published LoCoMo format (two sessions, three questions), written here
for the loader's and the distributed ingest's tests."""
from __future__ import annotations


def locomo_sample(sid="conv-1"):
    return {
        "sample_id": sid,
        "conversation": {
            "speaker_a": "Caroline", "speaker_b": "Melanie",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Caroline", "dia_id": "D1:1", "text": "I went to a support group yesterday."},
                {"speaker": "Melanie", "dia_id": "D1:2", "text": "That's great!"},
            ],
            "session_2_date_time": "1:14 pm on 25 May, 2023",
            "session_2": [
                {"speaker": "Melanie", "dia_id": "D2:1", "text": "I painted a lake.", "blip_caption": "a painting"},
                {"speaker": "Caroline", "dia_id": "D2:2", "text": "Lovely."},
            ],
        },
        "qa": [
            {"question": "When did Caroline go to the group?", "answer": "7 May 2023", "evidence": ["D1:1"], "category": 2},
            {"question": "What did Melanie paint?", "answer": "a lake", "evidence": ["D2:1; D1:2"], "category": 1},
            {"question": "What did Caroline paint?", "adversarial_answer": "a lake", "evidence": ["D2:1", "D9:9"],
             "category": 5},
        ],
    }
