# The test driver's handler on Gaffer::Exec: what each task does is in its payload.
use strict;
use warnings;
use Gaffer::Exec;
use Time::HiRes qw(sleep time);

# A preload the fork tests can see shared: written, so its pages are dirty in the zygote.
my $PRELOAD = 'x' x (($ENV{GAFFER_TEST_PRELOAD_MIB} // 0) * 1024 * 1024);

# The handler's own polling of the library, bounded so a broken library fails a test
# instead of hanging it.
sub wait_for {
    my ($check) = @_;
    my $deadline = time + 10;
    while (time < $deadline) { return 1 if $check->(); sleep 0.01 }
    return 0;
}

sub run {
    my ($task) = @_;
    my $p = $task->{payload};
    my $action = $p->{action} // 'ok';
    return { status => 'retry', delay_ms => $p->{delay_ms} } if $action eq 'retry';
    return { status => 'fail', error => $p->{error} } if $action eq 'fail';
    return undef if $action eq 'skip';
    die "$p->{message}\n" if $action eq 'raise';
    return { status => 'ok', result => sub { } } if $action eq 'unencodable';
    if ($action eq 'print') { print "$p->{message}\n"; system("echo $p->{message}-shell") }
    if ($action eq 'info') {
        return { status => 'ok', result => {
            pid => $$ + 0, pgid => getpgrp() + 0, ppid => getppid() + 0,
            slot => $ENV{GAFFER_SLOT}, queue => $ENV{GAFFER_QUEUE}, start => $ENV{GAFFER_START},
            frozen => undef, preload => length($PRELOAD) } };
    }
    if ($action eq 'wait_stop') {
        print "waiting $task->{id}\n";
        my $saw = wait_for(\&Gaffer::Exec::should_stop);
        return { status => 'ok', result => { saw_stop => $saw ? JSON::PP::true : JSON::PP::false } };
    }
    if ($action eq 'wait_cancel') {
        return { status => 'fail', error => 'cancelled' }
            if wait_for(sub { Gaffer::Exec::cancelled($task->{id}) });
    }
    return { status => 'ok' };
}

sub handle {
    my ($tasks) = @_;
    my @results;
    for my $task (@$tasks) {
        last if Gaffer::Exec::should_stop();
        my $result = run($task);
        push @results, { id => $task->{id}, %$result } if $result;
    }
    return \@results;
}

Gaffer::Exec::serve(\&handle);
