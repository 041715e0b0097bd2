//! The API server's Kubernetes version, followed: asked every `VERSION_EVERY` and whenever the
//! watches work again after failing, so a control-plane upgrade moves the topology rules up
//! without a restart; an older answer (an API server not yet upgraded) is not followed.
use std::{sync::Arc, time::Duration};

use tokio::sync::mpsc;

use crate::{
    agent::{AgentConfig, SourceConfig, start::ask_version},
    source,
};

/// How often the agent asks the API server its version again (also after every watch that
/// failed works again: a control-plane upgrade restarts the API servers).
const VERSION_EVERY: Duration = Duration::from_mins(10);

/// Which version to follow once the API server says `told` while `known` is followed: only a
/// newer one. During an upgrade of several API servers `/version` answers from whichever one
/// serves the request, old or new; the rules must not flap between them. A downgrade is
/// followed after a restart (or with `--kubernetes-version`).
fn newer_version(
    known: crate::translate::KubeVersion,
    told: crate::translate::KubeVersion,
) -> Option<crate::translate::KubeVersion> {
    (told > known).then_some(told)
}

/// With the API server's version to follow (no `--kubernetes-version`), starts
/// `follow`: the newer versions it finds, and what asks it to look now.
pub(in crate::agent) fn spawn_follower(
    config: &AgentConfig,
    known: crate::translate::KubeVersion,
) -> (
    mpsc::Receiver<crate::translate::KubeVersion>,
    Arc<tokio::sync::Notify>,
) {
    let (tx, rx) = mpsc::channel(4);
    let asked = Arc::new(tokio::sync::Notify::new());
    if config.ask_api_version {
        tokio::spawn(follow(config.clone(), known, asked.clone(), tx));
    }
    (rx, asked)
}

/// Asks the API server its version every `VERSION_EVERY` and when `asked`; sends each newer
/// one (the loop re-translates everything with its rules).
async fn follow(
    config: AgentConfig,
    mut known: crate::translate::KubeVersion,
    asked: Arc<tokio::sync::Notify>,
    tx: mpsc::Sender<crate::translate::KubeVersion>,
) {
    let SourceConfig::Kubernetes {
        kubeconfig,
        api_server,
    } = &config.source
    else {
        return;
    };
    let mut client: Option<kube::Client> = None;
    let mut older_said = None;
    loop {
        tokio::select! {
            () = tokio::time::sleep(VERSION_EVERY) => {}
            () = asked.notified() => {}
        }
        if client.is_none() {
            client = source::kube::client(kubeconfig.as_deref(), api_server.as_deref())
                .await
                .inspect_err(|e| tracing::debug!(error = %e, "building a client to ask the API server's version"))
                .ok();
        }
        let Some(c) = &client else { continue };
        let told = match ask_version(c).await {
            Ok(v) => v,
            Err(e) => {
                tracing::debug!(error = %e, "could not ask the API server its version; asked again later");
                continue;
            }
        };
        match newer_version(known, told) {
            Some(newer) => {
                tracing::info!(
                    was = %known,
                    kubernetes = %newer,
                    "the API server's version changed: following this version's kube-proxy topology rules (everything is translated again)"
                );
                known = newer;
                older_said = None;
                if tx.send(newer).await.is_err() {
                    return;
                }
            }
            None if told < known && older_said != Some(told) => {
                tracing::info!(
                    kubernetes = %known,
                    api_server = %told,
                    "an API server says an older version (mid-upgrade?): keeping the newer rules until the agent restarts"
                );
                older_said = Some(told);
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::newer_version;
    use crate::translate::KubeVersion;

    /// A control-plane upgrade raises the rules; an API server of the old version answering in
    /// the middle of it does not lower them again.
    #[test]
    fn only_a_newer_api_server_version_is_followed() {
        let v = |minor| KubeVersion { minor };
        assert_eq!(newer_version(v(33), v(34)), Some(v(34)));
        assert_eq!(newer_version(v(34), v(34)), None);
        assert_eq!(newer_version(v(34), v(33)), None);
    }
}
