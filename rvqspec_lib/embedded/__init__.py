"""Layer 6, how the shipped small model is made: corpus, codec fitting, talker and code-predictor training, the
neural code decoder's training, the model card. scripts/build_embedded.py runs it stage by stage.
"""
