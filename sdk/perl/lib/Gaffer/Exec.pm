package Gaffer::Exec;

# Write a gaffer `exec` handler once; the queue's config picks how it starts. Core modules
# only, so a host's system perl runs it. The POD at the end shows the use.

use strict;
use warnings;

use File::Spec ();
use IO::Handle ();
use IO::Select ();
use JSON::PP ();
use POSIX ();

our $VERSION = '1';

my $JSON = JSON::PP->new->utf8->allow_nonref;
my $replies;    # the handle protocol replies go to; see _claim_stdout
my $batch;      # what the handler may ask about the batch it runs

# Keeps fd 1 for replies in a private copy and points STDOUT (fd 1) at stderr, so a stray
# print, a C library or a subprocess logs instead of corrupting the protocol.
sub _claim_stdout {
    STDOUT->flush;
    open($replies, '>&', \*STDOUT) or die "gaffer: cannot copy stdout: $!\n";
    open(STDOUT, '>&', \*STDERR) or die "gaffer: cannot point stdout at stderr: $!\n";
    STDOUT->autoflush(1);
    STDERR->autoflush(1);
}

sub _log { print STDERR "Gaffer::Exec[$$]: $_[0]\n" }

sub _write { _send($JSON->encode($_[0]) . "\n") }

sub _send {
    my ($data) = @_;
    while (length $data) {
        my $n = syswrite($replies, $data);
        if (!defined $n) { next if $!{EINTR}; die "gaffer: cannot write a reply: $!\n" }
        substr($data, 0, $n, '');
    }
}

sub _parse { my $r = eval { $JSON->decode($_[0]) }; $r }

# Request lines from fd 0, read unbuffered (sysread), so that a stop or cancel line that
# arrives while a batch runs can be looked for without blocking: a buffered reader could
# hold it unseen while select() says nothing is waiting.
sub _stdin { { buffer => '', lines => [], closed => 0 } }

sub _read {
    my ($in) = @_;
    my $n = sysread(STDIN, my $chunk, 1 << 16);
    if (!defined $n) { return if $!{EINTR}; die "gaffer: cannot read stdin: $!\n" }
    if (!$n) { $in->{closed} = 1; return }
    $in->{buffer} .= $chunk;
    # Only the new chunk can end a line: a multi-megabyte batch is not rescanned per read.
    return if index($chunk, "\n") < 0;
    while ((my $at = index($in->{buffer}, "\n")) >= 0) {
        push @{ $in->{lines} }, substr($in->{buffer}, 0, $at + 1, '');
        chop $in->{lines}[-1];
    }
}

sub _next_line {
    my ($in) = @_;
    _read($in) while !@{ $in->{lines} } && !$in->{closed};
    return shift @{ $in->{lines} };
}

sub _poll {
    my ($in) = @_;
    my $select = IO::Select->new(\*STDIN);
    _read($in) while !$in->{closed} && $select->can_read(0);
}

# Takes the stop and cancel lines that arrived; any other line stays for the loop.
sub _look {
    _poll($batch->{stdin});
    my @keep;
    for my $line (@{ $batch->{stdin}{lines} }) {
        my $request = _parse($line);
        if (ref $request eq 'HASH' && $request->{stop}) { $batch->{stop} = 1 }
        elsif (ref $request eq 'HASH' && exists $request->{cancel}) {
            $batch->{cancels}{ $request->{cancel} } = 1;
        }
        else { push @keep, $line }
    }
    $batch->{stdin}{lines} = \@keep;
}

# Whether gaffer asked this slot to stop during the current batch ({"stop": true}). Look
# between tasks: on true, return the results of the tasks finished so far; the others go
# back to the queue unstarted, no attempt counted. Never blocks.
sub should_stop {
    return 0 unless $batch;
    _look();
    return $batch->{stop} ? 1 : 0;
}

# Whether gaffer cancelled the task (any task of the batch without an argument) while it
# runs: for kind = "long" queues, and for a batch queue's task past its `timeout`, which
# gaffer retries unless it answers "ok"; SIGTERM follows after cancel_grace otherwise.
sub cancelled {
    my ($id) = @_;
    return 0 unless $batch;
    _look();
    return $batch->{cancels}{$id} ? 1 : 0 if defined $id;
    return (grep { $batch->{cancels}{$_} } keys %{ $batch->{ids} }) ? 1 : 0;
}

# The reply line to one batch. A die (results that cannot be encoded too) fails every task
# of the batch with its text, as the task that died is unknown, and keeps the process
# serving.
sub _answer {
    my ($handle, $tasks) = @_;
    my $reply = eval {
        my $results = $handle->($tasks);
        die "handle() returned no array reference of results\n" if ref $results ne 'ARRAY';
        $JSON->encode({ results => $results }) . "\n";
    };
    return $reply if defined $reply;
    my $error = "$@";
    $error =~ s/\s+\z//;
    _log("handle() died: $error");
    my @failed = map { { id => $_->{id}, status => 'fail', error => $error } } @$tasks;
    return $JSON->encode({ results => \@failed }) . "\n";
}

# The exec protocol: one batch line in, one results line out, until end of input.
sub _exec_loop {
    my ($handle) = @_;
    my $in = _stdin();
    while (defined(my $line = _next_line($in))) {
        my $request = _parse($line);
        if (ref $request ne 'HASH' || ref $request->{batch} ne 'ARRAY') {
            # A stop or cancel for a batch already answered needs nothing.
            my $control = ref $request eq 'HASH'
                && (exists $request->{stop} || exists $request->{cancel});
            _log('unreadable request ignored: ' . substr($line, 0, 200)) unless $control;
            next;
        }
        my $tasks = $request->{batch};
        $batch = { stdin => $in, stop => 0, cancels => {},
            ids => { map { (ref $_ eq 'HASH' ? $_->{id} : '') => 1 } @$tasks } };
        my $reply = _answer($handle, $tasks);
        undef $batch;
        _send($reply);
    }
}

# The files whose change must replace the zygote: every loaded module and the script.
sub _source_files {
    my %files = map { File::Spec->rel2abs($_) => 1 } grep { defined && -f } values %INC, $0;
    return [ sort keys %files ];
}

# (id, spec, error) of a fork request line; error is undef when it is usable.
sub _fork_request {
    my $request = _parse($_[0]);
    my $spec = ref $request eq 'HASH' ? $request->{fork} : undef;
    return (undef, undef, 'not a fork request') if ref $spec ne 'HASH';
    for my $key (qw(stdin stdout stderr)) {
        return ($spec->{id}, undef, "fork request without a $key path")
            if !defined $spec->{$key} || ref $spec->{$key};
    }
    my $env = $spec->{env} // {};
    return ($spec->{id}, undef, 'fork request env is not an object of strings')
        if ref $env ne 'HASH' || grep { !defined || ref } values %$env;
    return ($spec->{id}, $spec, undef);
}

# A forked slot's process: its own process group, the slot's FIFOs as fds 1, 2, 0 (stdout
# and stderr first: gaffer must never read an end of file before the writers exist), the
# slot's environment, then the exec loop. Never returns; POSIX::_exit skips the zygote's
# END blocks and destructors, which are not the child's to run.
sub _child {
    my ($handle, $spec) = @_;
    my $code = 1;
    eval {
        defined POSIX::setpgid(0, 0) or die "setpgid: $!\n";
        $SIG{CHLD} = 'DEFAULT';
        my @plan = ([ stdout => POSIX::O_WRONLY, 1 ], [ stderr => POSIX::O_WRONLY, 2 ],
            [ stdin => POSIX::O_RDONLY, 0 ]);    # the stdin open waits for gaffer's end
        for my $p (@plan) {
            my ($key, $flags, $target) = @$p;
            my $fd = POSIX::open($spec->{$key}, $flags) // die "open $spec->{$key}: $!\n";
            defined POSIX::dup2($fd, $target) or die "dup2 $spec->{$key}: $!\n";
            POSIX::close($fd);
        }
        # The zygote's reply pipe: gaffer must see it close when the zygote dies.
        close $replies;
        my $env = $spec->{env} // {};
        $ENV{$_} = $env->{$_} for keys %$env;
        _claim_stdout();
        _watch_slot();
        _exec_loop($handle);
        $code = 0;
        1;
    } or print STDERR "Gaffer::Exec[$$]: forked child: $@";
    $_->flush for grep { defined } (select(), \*STDOUT, \*STDERR);
    POSIX::_exit($code);
}

# Ends this process's group once its slot is gone: the slot's end of stdin closing makes it
# hang up. A spawned child dies with its slot (gaffer sets its parent-death signal); a
# forked one's parent is the zygote, so a slot killed outright, or a whole host's gaffer
# gone, would leave it running its task while the task's lease passes to another slot.
# Perl has no threads to spare, so a small process of the group watches: it keeps only
# stdin (holding no writer of the slot's FIFOs), and at an orderly end of input the exec
# loop has exited before its grace is over.
sub _watch_slot {
    my $pid = fork() // do { _log("cannot fork the slot watcher: $!"); return };
    return if $pid;
    open(STDOUT, '>', '/dev/null');
    open(STDERR, '>', '/dev/null');
    close $replies if $replies;
    require IO::Poll;
    my $poll = IO::Poll->new;
    $poll->mask(\*STDIN => IO::Poll::POLLHUP());
    while (1) {
        $poll->poll;
        if ($poll->events(\*STDIN) & (IO::Poll::POLLHUP() | IO::Poll::POLLERR())) {
            select(undef, undef, undef, 1.0);
            kill 'KILL', -getpgrp();
            POSIX::_exit(0);
        }
    }
}

# The language zygote: announce readiness, then fork a child per request.
sub _zygote {
    my ($handle) = @_;
    # The kernel reaps children of a process that ignores SIGCHLD: no zombies, no waits.
    $SIG{CHLD} = 'IGNORE';
    _write({ ready => { pid => $$ + 0, files => _source_files() } });
    my $in = _stdin();
    while (defined(my $line = _next_line($in))) {
        my ($id, $spec, $error) = _fork_request($line);
        if (!defined $error) {
            STDERR->flush;    # or the child would write the zygote's pending log again
            my $pid = fork;
            if (!defined $pid) { $error = "fork: $!" }
            elsif ($pid == 0)  { _child($handle, $spec) }
            else { _write({ forked => { id => $id, pid => $pid + 0 } }); next }
        }
        if (defined $id) { _write({ failed => { id => $id, error => $error } }) }
        else { _log("unreadable request ignored ($error): " . substr($line, 0, 200)) }
    }
}

# Serves batches with $handle->(\@tasks) until the end of input, then exits 0.
sub serve {
    my ($handle) = @_;
    my $start = $ENV{GAFFER_START} // 'spawn';
    die "Gaffer::Exec: GAFFER_START='$start' is neither 'spawn' nor 'fork'\n"
        unless $start eq 'spawn' || $start eq 'fork';
    _claim_stdout();
    if ($start eq 'fork') { _zygote($handle) } else { _exec_loop($handle) }
    exit 0;
}

1;

__END__

=head1 NAME

Gaffer::Exec - write a gaffer exec handler once; the queue's config picks how it starts

=head1 SYNOPSIS

    use Gaffer::Exec;

    my %REFERENCE = load_reference_data();   # file level: loaded once, shared when forked

    sub handle {
        my ($tasks) = @_;   # [{id => "...", payload => <JSON value>, attempt => 1}, ...]
        return [ map { { id => $_->{id}, status => 'ok' } } @$tasks ];
    }

    Gaffer::Exec::serve(\&handle);

=head1 DESCRIPTION

Each result is C<{id, status =E<gt> 'ok'}> (optionally C<result>, C<next>),
C<{id, status =E<gt> 'retry'}> (optionally C<delay_ms> and C<priority>) or C<{id, status =E<gt> 'fail',
error}>; a task left out is retried by gaffer. README.md ("Handlers") has the protocol.

With C<start = "spawn"> (C<GAFFER_START> unset or C<spawn>) C<serve> speaks the exec
protocol on stdin/stdout. With C<start = "fork"> this process is the queue's language
zygote: it has already compiled the handler and loaded its data, and C<serve> forks one
child per slot on gaffer's request; the children share its memory copy-on-write.

C<should_stop()> (between tasks: gaffer asked the slot to stop; return the finished
tasks' results) and C<cancelled($id)> (a long queue's task was cancelled) never block.
C<print> goes to stderr: stdout belongs to the protocol. C<serve> never returns: it exits
0 at the end of input.

Install: C<perl Makefile.PL && make install> in F<sdk/perl>, or C<PERL5LIB=sdk/perl/lib>.

=cut
