"""The results tests. ``fixtures/`` holds JUnit files and the projects that wrote them (a pytest
project with failing tests among them): data, never collected."""

collect_ignore = ["fixtures"]
