//! The cluster's certificates and kubeconfig: a CA generated per cluster (rcgen), the API
//! server's serving certificate for every address it is reached at, an admin client certificate
//! (`system:masters`), and the service-account signing key.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::tls::{base64, TestCa, TestCert};

/// The files the control plane reads, all under one folder.
#[derive(Debug)]
pub struct Pki {
    /// `ca.crt`: signs the serving and client certificates.
    pub ca: PathBuf,
    /// `apiserver.crt` / `apiserver.key`.
    pub serving: (PathBuf, PathBuf),
    /// `sa.key`: service-account token signing key (PKCS#8), and its public half `sa.pub`.
    pub sa_key: PathBuf,
    /// `sa.pub`.
    pub sa_pub: PathBuf,
    /// `kubelet-client.crt` / `.key`: the API server's client certificate towards kubelets
    /// (`pods/log`, `exec`), group `system:masters`, which the kubelet's webhook authorizer allows.
    pub kubelet_client: (PathBuf, PathBuf),
    ca_pem: String,
    admin: TestCert,
    issuer: TestCa,
}

/// Every name and address the API server is reached at: loopback of both families, the node
/// addresses and the first address of each service range (the `kubernetes` Service).
const SERVING_NAMES: &[&str] = &[
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
    "127.0.0.1",
    "::1",
    super::NODE_IP_V4,
    super::NODE_IP_V6,
    "10.96.0.1",
    "fd00:10:96::1",
];

fn write(path: &Path, contents: &str) -> anyhow::Result<()> {
    std::fs::write(path, contents).with_context(|| format!("cannot write {}", path.display()))
}

impl Pki {
    /// Generates everything into `dir`.
    pub fn generate(dir: &Path) -> anyhow::Result<Pki> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let ca = TestCa::new("duet-cluster-ca");
        let serving = ca.issue(SERVING_NAMES);
        let admin = ca.issue_client("duet-admin", &["system:masters"]);
        let kubelet_client = ca.issue_client("kube-apiserver-kubelet-client", &["system:masters"]);
        let sa = rcgen::KeyPair::generate().context("service-account key")?;
        let pki = Pki {
            ca: dir.join("ca.crt"),
            serving: (dir.join("apiserver.crt"), dir.join("apiserver.key")),
            sa_key: dir.join("sa.key"),
            sa_pub: dir.join("sa.pub"),
            kubelet_client: (
                dir.join("kubelet-client.crt"),
                dir.join("kubelet-client.key"),
            ),
            ca_pem: ca.cert_pem.clone(),
            admin,
            issuer: ca,
        };
        write(&pki.ca, &pki.ca_pem)?;
        write(&pki.serving.0, &serving.cert_pem)?;
        write(&pki.serving.1, &serving.key_pem)?;
        write(&pki.sa_key, &sa.serialize_pem())?;
        write(&pki.sa_pub, &sa.public_key_pem())?;
        write(&pki.kubelet_client.0, &kubelet_client.cert_pem)?;
        write(&pki.kubelet_client.1, &kubelet_client.key_pem)?;
        Ok(pki)
    }

    /// A kubeconfig for the admin user against `server` (e.g. `https://127.0.0.1:6443`), with
    /// the certificates inline.
    pub fn kubeconfig(&self, server: &str) -> String {
        self.kubeconfig_of(server, "duet-admin", &self.admin)
    }

    /// A kubeconfig against `server` for a client certificate of this CA naming the user
    /// `user` in `groups` (e.g. `system:node:duet-node` in `system:nodes`).
    pub fn client_kubeconfig(&self, server: &str, user: &str, groups: &[&str]) -> String {
        let cert = self.issuer.issue_client(user, groups);
        self.kubeconfig_of(server, user, &cert)
    }

    fn kubeconfig_of(&self, server: &str, user: &str, cert: &TestCert) -> String {
        format!(
            "apiVersion: v1\n\
             kind: Config\n\
             clusters:\n\
             - name: duet\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\n\
             users:\n\
             - name: {user}\n  user:\n    client-certificate-data: {crt}\n    client-key-data: {key}\n\
             contexts:\n\
             - name: duet\n  context:\n    cluster: duet\n    user: {user}\n\
             current-context: duet\n",
            ca = base64(self.ca_pem.as_bytes()),
            crt = base64(cert.cert_pem.as_bytes()),
            key = base64(cert.key_pem.as_bytes()),
        )
    }
}
