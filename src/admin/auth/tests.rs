use super::*;

const FILE: &str = "# rotated by cert-manager's sibling\nops-bot s3cr3t\n\n  bare-token  \n";

#[test]
fn a_token_file_names_its_tokens_and_skips_blanks_and_comments() {
    let t = Tokens::parse("tokens", FILE).unwrap();
    assert_eq!(t.check(Some("Bearer s3cr3t")), Ok("ops-bot".to_owned()));
    assert_eq!(
        t.check(Some("bearer  bare-token ")),
        Ok("token 4".to_owned())
    );
}

#[test]
fn calls_without_a_token_are_401_and_with_a_wrong_one_403() {
    let t = Tokens::parse("tokens", FILE).unwrap();
    for header in [
        None,
        Some(""),
        Some("Bearer"),
        Some("Bearer   "),
        Some("Basic czNjcjN0"),
    ] {
        let refused = t.check(header).unwrap_err();
        assert_eq!(refused, Refusal::NoCredentials, "{header:?}");
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    }
    for header in [
        "Bearer s3cr3",
        "Bearer s3cr3tX",
        "Bearer ops-bot",
        "Bearer S3CR3T",
    ] {
        let refused = t.check(Some(header)).unwrap_err();
        assert_eq!(refused, Refusal::WrongToken, "{header:?}");
        assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    }
}

#[test]
fn without_a_token_file_every_call_is_403_naming_the_variable() {
    let auth = AdminAuth::off();
    let refused = auth.check(Some("Bearer anything")).unwrap_err();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    assert!(
        refused.to_string().contains("SLUICE_ADMIN_TOKEN_FILE"),
        "{refused}"
    );
    assert_eq!(auth.refresh(), Ok(false));
}

#[test]
fn a_bad_token_file_says_where() {
    assert_eq!(
        Tokens::parse("f", "a b c\n").unwrap_err().to_string(),
        "f:1: expected `[name ]token`, found 3 fields"
    );
    assert_eq!(
        Tokens::parse("f", "one t\n#\ntwo t\n")
            .unwrap_err()
            .to_string(),
        "f:3: the same token as line 1"
    );
    assert_eq!(
        Tokens::parse("f", "# nothing\n\n").unwrap_err().to_string(),
        "f: no token (every line is blank or a comment)"
    );
}

#[test]
fn a_token_file_past_its_cap_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens");
    let long = "t".repeat(usize::try_from(MAX_TOKEN_FILE_BYTES).unwrap() + 1);
    fs::write(&path, long).unwrap();
    let err = AdminAuth::from_file(path).err().unwrap();
    assert!(matches!(err, TokenFileError::TooLarge { .. }), "{err}");
}

#[test]
fn tokens_rotate_when_the_file_changes_and_a_bad_file_keeps_the_old_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens");
    fs::write(&path, "alice old\n").unwrap();
    let auth = AdminAuth::from_file(path.clone()).unwrap();
    assert_eq!(auth.check(Some("Bearer old")), Ok("alice".to_owned()));
    assert_eq!(auth.refresh(), Ok(false), "nothing changed");

    // A Secret's rotation: a new file renamed over the old one (a new inode).
    let next = dir.path().join("tokens.new");
    fs::write(&next, "alice new\nbob other\n").unwrap();
    fs::rename(&next, &path).unwrap();
    assert_eq!(auth.refresh(), Ok(true));
    assert_eq!(auth.check(Some("Bearer old")), Err(Refusal::WrongToken));
    assert_eq!(auth.check(Some("Bearer other")), Ok("bob".to_owned()));

    // A half-written file does not parse: the tokens in force stay.
    let next = dir.path().join("tokens.new");
    fs::write(&next, "alice new extra\n").unwrap();
    fs::rename(&next, &path).unwrap();
    assert!(matches!(auth.refresh(), Err(TokenFileError::Shape { .. })));
    assert_eq!(auth.check(Some("Bearer new")), Ok("alice".to_owned()));
}
