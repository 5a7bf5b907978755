"""What the tests share besides fixtures: small configs, the writers of tiny dataset files in the
real on-disk formats, the pinned digests and fake executors. Test modules import from here
(``from support.configs import small_config``), never from one another; fixtures live in
``conftest.py``."""
