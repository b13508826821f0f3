"""trace: a loaded job laid out as one timeline and written as Perfetto protobuf or Chrome JSON, plus the preview.

``timeline.write_timeline`` lays the job out through the ``sink.TraceSink`` interface; ``formats`` picks the
writer from the output's suffix; ``check`` decodes a written trace and checks its rules. Never imports torch.
"""
