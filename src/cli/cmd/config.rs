//! `gaffer config check | apply`.

use clap::Subcommand;

use crate::cli::{CliError, Global};

/// `gaffer config …`.
#[derive(Subcommand)]
pub enum ConfigCmd {
    /// Check the config: every error with file:line:col and the key; exit 2 on error
    Check,
    /// Validate the config and publish it to Redis; running manager and masters adopt it
    /// within a tick, without a restart
    Apply,
}

/// `gaffer config check`: the summary on stdout, or every error on stderr and exit 2.
pub fn check(global: &Global) -> Result<(), CliError> {
    let cfg = global.load()?;
    println!("{}", cfg.summary());
    Ok(())
}

/// `gaffer config apply`: validates the config, then publishes it with a new version.
pub async fn apply(global: &Global) -> Result<(), CliError> {
    let (cfg, source) = global.load_source()?;
    let published = without_password(&source, cfg.cluster.redis.as_deref())?;
    let client = global.connect(&cfg).await?;
    let keys = crate::cluster::Keys::new(&cfg.cluster.namespace);
    refuse_stored_names(&client, &keys, &cfg).await?;
    let version =
        crate::cluster::publish_config(&mut client.connection(), &keys, &published).await?;
    println!("published config version {version}: {}", cfg.summary());
    Ok(())
}

/// Refuses a config whose `[[schedules]]` take a name a schedule stored through the API
/// already has: one name, one schedule (the API refuses the other way round).
async fn refuse_stored_names(
    client: &crate::queue_client::QueueClient,
    keys: &crate::cluster::Keys,
    cfg: &crate::config::Config,
) -> Result<(), CliError> {
    let stored = crate::schedule::store::read(&mut client.connection(), keys).await?;
    let taken: Vec<&str> = cfg
        .schedules
        .iter()
        .map(|s| s.name.as_str())
        .filter(|n| stored.get(n).is_some())
        .collect();
    if taken.is_empty() {
        return Ok(());
    }
    Err(CliError::Usage(format!(
        "[[schedules]] named {} already stored through the api: rename the config's, or \
         delete the stored one first (`gaffer schedules delete NAME`)",
        taken.join(", ")
    )))
}

/// The config text as every role may read it from Redis: a password in `[cluster].redis`
/// masked (roles connect with their own URL, never the published one). A password the
/// text hides in an escaped form cannot be masked, so it is refused rather than published.
fn without_password(source: &str, url: Option<&str>) -> Result<String, CliError> {
    let Some(url) = url else {
        return Ok(source.to_string());
    };
    let masked = crate::queue_client::redacted(url);
    if masked == url {
        return Ok(source.to_string());
    }
    let text = source.replace(url, &masked);
    let passwords = crate::queue_client::url_passwords(url);
    if passwords.iter().any(|pw| text.contains(pw)) {
        return Err(CliError::Usage(
            "[cluster].redis holds a password config apply cannot mask: move it to \
             [cluster].redis_password_file"
                .into(),
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::without_password;

    #[test]
    fn the_published_text_masks_the_url_password() {
        let url = "redis://gaffer:s3cret@db:6379/0";
        let source = format!("[cluster]\nredis = \"{url}\"\n");
        let text = without_password(&source, Some(url)).unwrap();
        assert_eq!(
            text,
            "[cluster]\nredis = \"redis://gaffer:***@db:6379/0\"\n"
        );
        let plain = "[cluster]\nredis = \"redis://db/0\"\n";
        assert_eq!(
            without_password(plain, Some("redis://db/0")).unwrap(),
            plain
        );
    }

    #[test]
    fn a_unix_socket_password_is_masked_too() {
        let url = "redis+unix:///run/redis.sock?user=gaffer&pass=s3cret";
        let source = format!("[cluster]\nredis = \"{url}\"\n");
        let text = without_password(&source, Some(url)).unwrap();
        assert!(
            !text.contains("s3cret") && text.contains("pass=***"),
            "{text}"
        );
    }

    #[test]
    fn a_password_it_cannot_mask_is_refused() {
        // Written with a TOML escape, the URL does not appear in the text as it is.
        let source = "[cluster]\nredis = \"redis://gaffer:s3cret@db\\u002F0\"\n# s3cret\n";
        let err = without_password(source, Some("redis://gaffer:s3cret@db/0")).unwrap_err();
        assert!(err.to_string().contains("redis_password_file"), "{err}");
    }
}
