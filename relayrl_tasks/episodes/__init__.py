"""A multi-turn episode (a sample playing several turns against its environment), by the
rules the rollout worker (rollout_svc/episodes.py, episode_generator.py) and the evaluator
(relayrl_torch/evaluation/episodes.py) share, so an evaluated episode is played, laid out and
scored as a trained one is:

    turns.py     the template's tokens between two assistant turns (TurnGlue)
    play.py      opening an episode, stepping its environment on a reply, when it goes on,
                 and the environment errors it can end with
    sequence.py  the episode as one token sequence: the policy-token mask and its counts
    reward.py    the episode's reward

No torch here: the trainer reads a step's episodes (sequence.py) without the model side.
"""
