# lit configuration for dlopt's IR, tool and end-to-end suites.
import os
import lit.formats

config.name = "dlopt"
config.test_format = lit.formats.ShTest(execute_external=True)
config.suffixes = [".mlir", ".test"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.dlopt_obj_root, "test")
config.excludes = ["lit.cfg.py", "lit.site.cfg.py", "unit", "numeric", "fuzz", "Inputs", "CMakeLists.txt"]

# Tools: ours first, then LLVM's FileCheck/not/split-file.
config.environment["PATH"] = os.pathsep.join(
    [config.dlopt_tools_dir, config.llvm_tools_dir, config.environment.get("PATH", os.environ["PATH"])])
config.environment["FILECHECK_OPTS"] = "--enable-var-scope"
config.substitutions.append(("%python", config.python_executable))
config.substitutions.append(("%dlopt_src", config.dlopt_src_root))
config.substitutions.append(("%numeric", os.path.join(config.dlopt_src_root, "test", "numeric")))

# GPU tests declare `REQUIRES: cuda-gpu`; the feature is set only when a
# device probe succeeds, so they skip (with the reason) elsewhere.
if os.environ.get("DLOPT_CUDA_GPU") == "1":
    config.available_features.add("cuda-gpu")

# Multi-process tests (mpirun) declare `REQUIRES: mpi`.
import shutil
if shutil.which("mpirun"):
    config.available_features.add("mpi")

# srun tests start a one-node Slurm cluster (scripts/local-slurm.sh), which
# needs root and Debian's slurm-wlm and munge; they declare `REQUIRES: slurm`.
if (os.geteuid() == 0 and all(shutil.which(t) for t in ("srun", "slurmctld", "slurmd", "munged"))):
    config.available_features.add("slurm")
