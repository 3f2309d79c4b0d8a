"""A binary a run drops does not run: checks shared by the root and unprivileged suites.

The working directory and ``/dev/shm`` are ``noexec`` tmpfs mounts, and ``memfd_create``
answers ENOSYS (see ``evaluator.seccomp``). The binary is ``ld.so``, copied: an executable
every run can read (its interpreter is dynamic) that needs nothing else to start.
"""

from __future__ import annotations

import json

#: Copies the dynamic loader into /dev/shm and into a memfd and tries to execute each copy;
#: prints what each attempt gave (an exit status, or the errno's name), and whether the
#: original runs (so that a refusal is the place's, not the binary's).
DROP_AND_EXECUTE = r"""
import errno, json, os, subprocess

loader = next(line.split()[-1] for line in open('/proc/self/maps') if '/ld-linux' in line)
elf = open(loader, 'rb').read()

def execute(argv, **kwargs):
    try:
        return subprocess.run([*argv, '--version'], capture_output=True, **kwargs).returncode
    except OSError as exc:
        return errno.errorcode[exc.errno]

out = {'original': execute([loader])}
with open('/dev/shm/dropped', 'wb') as f:
    f.write(elf)
os.chmod('/dev/shm/dropped', 0o755)
out['shm'] = execute(['/dev/shm/dropped'])
try:
    fd = os.memfd_create('dropped', 0)
except OSError as exc:
    out['memfd'] = errno.errorcode[exc.errno]
else:
    os.write(fd, elf)
    out['memfd'] = execute([f'/proc/self/fd/{fd}'], pass_fds=[fd])
print(json.dumps(out))
"""


def check_not_executed(stdout: str) -> None:
    """The original runs; the copy in /dev/shm is refused (noexec), and no memfd is made."""
    assert json.loads(stdout) == {"original": 0, "shm": "EACCES", "memfd": "ENOSYS"}, stdout


#: What uses /dev/shm and native callbacks, and must keep working: multiprocessing's pool,
#: locks and shared memory, a numpy array on that memory, a ctypes callback (libffi).
SHM_STILL_WORKS = r"""
import ctypes, multiprocessing
from multiprocessing import shared_memory
import numpy as np

def square(x):
    return x * x

if __name__ == '__main__':
    with multiprocessing.get_context('fork').Pool(2) as pool:
        print(sum(pool.map(square, range(10))))
    lock = multiprocessing.Lock()
    with lock:
        block = shared_memory.SharedMemory(create=True, size=80)
        array = np.ndarray((10,), dtype=np.int64, buffer=block.buf)
        array[:] = np.arange(10)
        print(int(array.sum()))
        del array
        block.close()
        block.unlink()
    compare = ctypes.CFUNCTYPE(
        ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)
    )(lambda a, b: a[0] - b[0])
    values = (ctypes.c_int * 3)(3, 1, 2)
    ctypes.CDLL(None).qsort(values, 3, ctypes.sizeof(ctypes.c_int), compare)
    print(list(values))
"""


def check_shm_still_works(stdout: str) -> None:
    assert stdout == "285\n45\n[1, 2, 3]\n", stdout
