#!/usr/bin/python3
"""deploy/ checked as far as this machine can check it (no cluster here).

1. `bash -n` of every shell script in deploy/;
2. every manifest in deploy/k8s parses as YAML (python3-yaml), and its
   pods mount the claim shardrec-shared at /shared, the MPIJob's launcher
   restarts on failure and its command has --auto-resume;
3. every `shardrec CMD --flag` in the scripts, manifests and the unit is a
   flag of `shardrec CMD --help` (a renamed flag fails here), and every
   recipe's serve sets --checkpoint-root, --allow-push and --allow-admin,
   and its train --auto-resume and --save-checkpoint;
4. make-certs.sh makes certificates openssl verifies against its CA, with
   the SAN names asked for;
5. `systemd-analyze verify` of the unit (binary path pointed at this build),
   skipped with a message where systemd-analyze is not installed.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

SRC = os.environ["SHARDREC_SRC"]
BIN = os.environ["SHARDREC_BIN"]
DEPLOY = os.path.join(SRC, "deploy")
COMMANDS = ("serve", "train", "plan", "datagen", "convert", "eval", "predict", "reshard", "inspect")
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


def files(ext):
    out = []
    for root, _, names in os.walk(DEPLOY):
        out += [os.path.join(root, n) for n in sorted(names) if n.endswith(ext)]
    return sorted(out)


def rel(p):
    return os.path.relpath(p, SRC)


def check_bash():
    scripts = files(".sh") + files(".sbatch")
    for s in scripts:
        r = subprocess.run(["bash", "-n", s], capture_output=True, text=True)
        if r.returncode:
            fail("bash -n %s: %s" % (rel(s), r.stderr.strip()))
    if len(scripts) < 2:
        fail("deploy/: expected the Slurm script and make-certs.sh, found %s" % scripts)
    print("bash -n: %d script(s)" % len(scripts))


def strings(node):
    """Every string in a YAML document; a command/args list joined by spaces."""
    if isinstance(node, dict):
        out = []
        for k, v in node.items():
            if k in ("command", "args") and isinstance(v, list):
                out.append(" ".join(str(x) for x in v))
            else:
                out += strings(v)
        return out
    if isinstance(node, list):
        return [s for x in node for s in strings(x)]
    return [node] if isinstance(node, str) else []


def pod_specs(doc):
    kind = doc.get("kind")
    spec = doc.get("spec", {})
    if kind in ("StatefulSet", "Job", "Deployment"):
        return [(kind, spec["template"]["spec"])]
    if kind == "MPIJob":
        return [(kind + "/" + r, v["template"]["spec"]) for r, v in spec["mpiReplicaSpecs"].items()]
    return []


def check_shared_mount(name, spec):
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    shared = [n for n, v in vols.items()
              if v.get("persistentVolumeClaim", {}).get("claimName") == "shardrec-shared"]
    if len(shared) != 1:
        fail("%s: no volume of the claim shardrec-shared" % name)
        return
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        mounts = [m for m in c.get("volumeMounts", []) if m["name"] == shared[0]]
        if [m["mountPath"] for m in mounts] != ["/shared"]:
            fail("%s container %s: the shared claim is not mounted at /shared (%s)" % (name, c["name"], mounts))


def check_yaml():
    texts = {}
    docs = []
    for m in files(".yaml"):
        try:
            ds = [d for d in yaml.safe_load_all(open(m)) if d is not None]
        except yaml.YAMLError as e:
            fail("%s: not YAML: %s" % (rel(m), e))
            continue
        for d in ds:
            if not {"apiVersion", "kind", "metadata"} <= set(d):
                fail("%s: a document without apiVersion, kind and metadata" % rel(m))
            docs.append((m, d))
        texts[m] = "\n".join(s for d in ds for s in strings(d))
    kinds = sorted(d["kind"] for _, d in docs)
    for k in ("MPIJob", "PersistentVolumeClaim", "Secret", "Service", "StatefulSet"):
        if k not in kinds:
            fail("deploy/k8s: no %s (have %s)" % (k, kinds))
    for m, d in docs:
        for name, spec in pod_specs(d):
            check_shared_mount("%s %s" % (rel(m), name), spec)
        if d["kind"] == "Service" and d["spec"].get("clusterIP") != "None":
            fail("%s: the Service is not headless" % rel(m))
        if d["kind"] == "MPIJob":
            if d["apiVersion"] != "kubeflow.org/v2beta1":
                fail("%s: MPIJob apiVersion %s" % (rel(m), d["apiVersion"]))
            launcher = d["spec"]["mpiReplicaSpecs"]["Launcher"]
            if launcher.get("restartPolicy") not in ("OnFailure", "Always", "ExitCode"):
                fail("%s: the launcher is not restarted on failure" % rel(m))
    print("yaml: %d document(s): %s" % (len(docs), ", ".join(kinds)))
    return texts


def commands(text):
    """(cmd, [flags]) of every `shardrec CMD ...` in text (shell continuation
    lines joined; a command ends at ; & | < > or the end of its line)."""
    text = re.sub(r"\\\n", " ", text)
    out = []
    for m in re.finditer(r"(?<![\w/.-])(?:[\w/.]*/)?shardrec\s+(%s)\b([^\n;&|<>]*)" % "|".join(COMMANDS), text):
        flags = re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", m.group(2))
        out.append((m.group(1), flags))
    return out


help_cache = {}


def help_of(cmd):
    if cmd not in help_cache:
        r = subprocess.run([BIN, cmd, "--help"], capture_output=True, text=True)
        help_cache[cmd] = r.stdout + r.stderr
    return help_cache[cmd]


def has_flag(cmd, flag):
    return re.search(r"(?<![\w-])%s(?![\w-])" % re.escape(flag), help_of(cmd)) is not None


def check_flags(texts):
    recipes = {rel(f): open(f).read() for f in files(".sbatch") + files(".service")}
    recipes.update({rel(f): t for f, t in texts.items()})
    n = 0
    for name, text in sorted(recipes.items()):
        cmds = commands(text)
        for cmd, flags in cmds:
            for f in flags:
                n += 1
                if not has_flag(cmd, f):
                    fail("%s: shardrec %s %s is not in `shardrec %s --help`" % (name, cmd, f, cmd))
        used = {(c, f) for c, fl in cmds for f in fl}
        if any(c == "serve" for c, _ in cmds):
            for f in ("--checkpoint-root", "--allow-push", "--allow-admin", "--tls-client-ca"):
                if ("serve", f) not in used:
                    fail("%s: serve without %s" % (name, f))
        if any(c == "train" for c, _ in cmds):
            for f in ("--auto-resume", "--save-checkpoint", "--tls-cert"):
                if ("train", f) not in used:
                    fail("%s: train without %s" % (name, f))
    serves = [n for n, t in recipes.items() if any(c == "serve" for c, _ in commands(t))]
    trains = [n for n, t in recipes.items() if any(c == "train" for c, _ in commands(t))]
    if len(serves) < 3 or len(trains) < 2:
        fail("expected serve in the Slurm script, the StatefulSet and the unit, train in the Slurm script and the MPIJob: serve in %s, train in %s" % (serves, trains))
    print("flags: %d use(s) of shardrec flags checked against --help in %d recipe file(s)" % (n, len(recipes)))


def check_certs():
    if not shutil.which("openssl"):
        print("certs: skipped: openssl is not installed")
        return
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([os.path.join(DEPLOY, "certs", "make-certs.sh"), d,
                            "shardrec-shard-0.shardrec-shard,198.18.0.1", "trainer"],
                           capture_output=True, text=True)
        if r.returncode:
            fail("make-certs.sh: exit %d: %s" % (r.returncode, r.stderr))
            return
        for c in ("server", "trainer"):
            v = subprocess.run(["openssl", "verify", "-CAfile", d + "/ca.pem", "%s/%s.pem" % (d, c)],
                               capture_output=True, text=True)
            if v.returncode:
                fail("make-certs.sh: %s.pem does not verify: %s" % (c, v.stdout + v.stderr))
        t = subprocess.run(["openssl", "x509", "-in", d + "/server.pem", "-noout", "-ext", "subjectAltName"],
                           capture_output=True, text=True).stdout
        if "DNS:shardrec-shard-0.shardrec-shard" not in t or "IP Address:198.18.0.1" not in t:
            fail("make-certs.sh: server.pem's SAN is %r" % t)
    print("certs: make-certs.sh's server and client certificates verify against its CA")


def check_unit():
    units = files(".service")
    if not units:
        fail("deploy/systemd: no unit")
        return
    if not shutil.which("systemd-analyze"):
        print("systemd: skipped: systemd-analyze is not installed (the unit was not verified)")
        return
    with tempfile.TemporaryDirectory() as d:
        for u in units:
            name = os.path.basename(u).replace("@.", "@0.")
            with open(os.path.join(d, name), "w") as out:
                out.write(open(u).read().replace("/usr/local/bin/shardrec", BIN))
            r = subprocess.run(["systemd-analyze", "verify", os.path.join(d, name)],
                               capture_output=True, text=True)
            msg = (r.stdout + r.stderr).strip()
            if r.returncode or msg:
                fail("systemd-analyze verify %s: exit %d: %s" % (rel(u), r.returncode, msg))
    print("systemd: systemd-analyze verify: %d unit(s)" % len(units))


def main():
    check_bash()
    texts = check_yaml()
    check_flags(texts)
    check_certs()
    check_unit()
    if failures:
        print("test_deploy: %d failure(s)" % len(failures))
        return 1
    print("test_deploy: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
