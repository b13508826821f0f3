"""report: the figures of a job (overlap, exposed communication, bandwidth, stragglers, modules) as one plain dict.

``document.build_report`` assembles them; the renderers in ``render/`` only format that dict. Never imports torch.
"""
