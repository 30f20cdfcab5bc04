"""Task circuits: which edges of the residual-stream graph carry a behaviour.

``tasks`` (prompt pairs with an answer and a distractor; ``ioi``, ``induction``,
``successor``; user JSONL), ``benchmark_tasks`` (after MIB: ``ioi-mib``, ``addition``,
``subtraction``, ``mcqa``), ``bundled`` (every bundled task by name), ``model`` (the probed
forward of the demo and of TransformerBridge models), ``attribution`` (EAP and EAP-IG over
every writer -> reader edge) and ``faithfulness`` (circuits checked by real intervention; EAP
against edge patching).
"""
