"""Layer 3, data: what training and evaluation both read. Teacher-forced passes of the talker over real codes
(``teacher``), the shipped utterances beside a model (``utterances``), the code predictor's frames (``frames``: the
contexts, true codes and hidden states of many frames, saved and loaded as one file) and where frames come from
(``frame_sources``: utterances, HF ``datasets``, synthesis). Imports only common, decoding and models.
"""
