"""Layer 5, training: the one training loop and the drafter trainers. Imports only the layers below it.
"""
