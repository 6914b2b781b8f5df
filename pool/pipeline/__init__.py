"""The pipeline: the pool of units and what runs inside one (registry, unit, stages, messages,
pacing, phrase splitting, turn timings).

A unit is a chain of stage threads with private queues, VAD -> STT -> LLM -> TTS, serving one
session at a time; the registry is the process's set of units and their states. The pipeline
computes; it imports no ORM and nothing of ``realtime`` (the protocol hands it wire decoders and
encoders as objects), and it tells the database nothing itself: state changes go to the recorder
it is given (``pool.history``).
"""
