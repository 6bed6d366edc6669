"""Adapters that hand a guarded effect tool (``workers.guard``) to an agent framework.

Each lives in its own module behind an optional extra and imports nothing here, so
``import workers`` never pulls a framework in:

* ``workers.agents.crewai``    — ``pip install 'effectq[crewai]'``: a CrewAI ``BaseTool``
* ``workers.agents.langchain`` — ``pip install 'effectq[langchain]'``: a ``StructuredTool``
"""
