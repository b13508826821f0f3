"""render: reports and diagnoses as text, CSV, HTML, PNG and SVG, worded the same way everywhere
(``comm2perfetto.words``).

Renderers take the plain data the products return (a report dict, a ``Diagnosis``) and compute nothing of their
own. Never imports torch.
"""
