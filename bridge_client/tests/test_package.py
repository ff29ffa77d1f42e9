import subprocess
import sys


def test_it_imports_without_the_relay_service():
    # The bridge ships on its own to Puppet servers: importing it must not pull in Django.
    code = "import sys, relay_bridge; print(relay_bridge.__version__); print('django' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    version, django_loaded = out.stdout.split()
    assert version == "0.1.0"
    assert django_loaded == "False"
