"""The hand-off types of a split's journey (consume -> build -> publish): a sealed split of a
partition's offsets and its kill switch. Below every stage that passes them on: each stage
imports them, none imports another stage to reach them."""
