"""How the shipped small model is made: corpus, codec fitting, talker and code-predictor training, the neural code
decoder's training, the model card. ``python -m recipes.embedded.build`` (``make embedded``) runs it stage by stage.
Imports rvqspec_lib; the library never imports this package.
"""
